#!/bin/sh
# gpunet pool provider hook: delete machines (suspend_program). Called as
#   aws-suspend.sh POOL NODE...
# with the environment of aws-resume.sh. Called once a node holds no task (after a scale-in, a reclaim, or a boot
# that timed out: the machine may never have come up, so a missing instance is not an error). Exit 0 when every
# machine is gone or going; anything else is reported and tried again later.
set -eu
[ -r /etc/gpunet/pools/aws.env ] && . /etc/gpunet/pools/aws.env
pool="$1"; shift
for node in "$@"; do
    ids=$(aws ec2 describe-instances \
        --filters "Name=tag:Name,Values=$node" "Name=tag:gpunet-pool,Values=$pool" \
                  "Name=instance-state-name,Values=pending,running,stopping,stopped" \
        --query 'Reservations[].Instances[].InstanceId' --output text)
    [ -n "$ids" ] || continue
    # shellcheck disable=SC2086 # one or more instance ids
    aws ec2 terminate-instances --instance-ids $ids > /dev/null
done
