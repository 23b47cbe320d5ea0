#!/bin/sh
# gpunet agent notice command (`gpunet agent --notice-command /etc/gpunet/pools/spot-notice.sh`): the agent runs it
# every few seconds; it prints the seconds left before the cloud takes the machine back, or nothing. The agent then
# sends the server the reclaim notice for its own node (POST /v1/nodes/NODE/reclaim with its node credential).
# This one reads the AWS instance metadata (IMDSv2): a spot interruption notice is given two minutes ahead.
set -eu
token=$(curl -s -m 2 -X PUT http://169.254.169.254/latest/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 60') || exit 0
notice=$(curl -s -m 2 -f -H "X-aws-ec2-metadata-token: $token" \
    http://169.254.169.254/latest/meta-data/spot/instance-action) || exit 0
# {"action": "terminate", "time": "2026-12-01T10:00:00Z"}
at=$(echo "$notice" | sed -n 's/.*"time" *: *"\([^"]*\)".*/\1/p')
[ -n "$at" ] || exit 0
left=$(( $(date -d "$at" +%s) - $(date +%s) ))
[ "$left" -gt 0 ] || left=1
echo "$left"
