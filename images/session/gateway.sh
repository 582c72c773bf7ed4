#!/bin/sh
# Start the egress policy proxy of the gateway role (supervisord program `proxy`), with its control API.
# Environment (set by the sandbox backend):
#   GATEWAY_POLICY_FILE         policy JSON written by the controller
#   GATEWAY_PROXY_PORT          port the guest's HTTP(S)_PROXY points at
#   GATEWAY_DECISION_LOG        JSONL decision log the controller collects
#   GATEWAY_CONTROL_PORT        the control API's port (optional): it listens on every address outside
#                               INTERNAL_SUBNET (the egress side) and refuses peers from that subnet
#   GATEWAY_CONTROL_TOKEN_FILE  the control API's bearer token, written by the controller
#   INTERNAL_SUBNET             the guest-facing network(s), comma-separated CIDRs
#   RELAY_PORT                  the agent relay's port, which the proxy must never connect to
set -eu
if [ -n "${GATEWAY_CONTROL_PORT:-}" ]; then
  set -- --control-listen "0.0.0.0:$GATEWAY_CONTROL_PORT" \
    --control-token-file "$GATEWAY_CONTROL_TOKEN_FILE" \
    --control-exclude "$INTERNAL_SUBNET"
fi
if [ -n "${RELAY_PORT:-}" ]; then
  set -- "$@" --reserved-port "$RELAY_PORT"
fi
exec /opt/desktop-sandbox/bin/python -m controller.gateway serve \
  --policy "$GATEWAY_POLICY_FILE" \
  --port "$GATEWAY_PROXY_PORT" \
  --decision-log "$GATEWAY_DECISION_LOG" \
  "$@"
