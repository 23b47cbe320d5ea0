#!/bin/sh
# gpunet pool provider hook: create machines (resume_program). Called as
#   aws-resume.sh POOL NODE...
# with an empty environment but PATH and these (set by the gpunet server):
#   GPUNET_SERVER           the URL the agent must join (https://...)
#   GPUNET_NODE_TOKENS      NODE=TOKEN for each node, space-separated: the token that node's agent registers with
#                           (its --join-token). It registers that node only, once; the server's join token cannot
#                           register a pool's node.
#   GPUNET_CA               (optional) the CA certificate path on the server; copied into the user data below
#   GPUNET_POOL, GPUNET_POOL_ZONE, GPUNET_POOL_LIFECYCLE (spot | on-demand), GPUNET_POOL_GPU_MODEL,
#   GPUNET_POOL_GPUS, GPUNET_POOL_LABELS (zone=...,lifecycle=...,gpunet.io/pool=...: pass to --labels)
# Exit 0 once every machine is asked for; anything else is a failure the server reports and retries with backoff.
# A machine whose agent has not registered within the pool's boot_timeout_s is deleted (suspend_program) and asked
# for again later. The hook may take up to the pool's hook_timeout_s; it is killed after that.
#
# This example uses the AWS CLI; edit the settings below (or set them in /etc/gpunet/pools/aws.env, read first).
# The instance gets user data that installs gpunet and runs the agent under the node's name.
set -eu
[ -r /etc/gpunet/pools/aws.env ] && . /etc/gpunet/pools/aws.env
: "${AMI_ID:?set AMI_ID (an image with the NVIDIA driver and gpunet installed) in /etc/gpunet/pools/aws.env}"
: "${SUBNET_ID:?set SUBNET_ID}"
: "${SECURITY_GROUP_ID:?set SECURITY_GROUP_ID}"
INSTANCE_TYPE="${INSTANCE_TYPE:-g5.48xlarge}"   # 8x A10G: match the pool's gpus_per_node and gpu_model

pool="$1"; shift
market=""
if [ "$GPUNET_POOL_LIFECYCLE" = spot ]; then
    market='--instance-market-options MarketType=spot,SpotOptions={SpotInstanceType=one-time,InstanceInterruptionBehavior=terminate}'
fi
ca=""
[ -n "${GPUNET_CA:-}" ] && ca="$(base64 -w0 "$GPUNET_CA")"
for node in "$@"; do
    token=$(printf '%s\n' $GPUNET_NODE_TOKENS | sed -n "s/^$node=//p")
    [ -n "$token" ] || { echo "no registration token for $node" >&2; exit 1; }
    userdata=$(cat <<USERDATA
#!/bin/sh
set -e
[ -n "$ca" ] && echo "$ca" | base64 -d > /etc/gpunet-ca.pem
exec gpunet agent --server "$GPUNET_SERVER" --join-token "$token" --name "$node" \
    --labels "$GPUNET_POOL_LABELS" --data-dir /var/lib/gpunet-agent \
    \$( [ -n "$ca" ] && echo --ca /etc/gpunet-ca.pem )
USERDATA
)
    # shellcheck disable=SC2086 # $market is a list of arguments
    aws ec2 run-instances --image-id "$AMI_ID" --instance-type "$INSTANCE_TYPE" --count 1 \
        --subnet-id "$SUBNET_ID" --security-group-ids "$SECURITY_GROUP_ID" $market \
        --tag-specifications "ResourceType=instance,Tags=[{Key=Name,Value=$node},{Key=gpunet-pool,Value=$pool}]" \
        --user-data "$userdata" --query 'Instances[0].InstanceId' --output text
done
