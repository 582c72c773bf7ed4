#!/bin/sh
# Start the egress policy proxy of the gateway role (supervisord program `proxy`).
# Environment (set by the sandbox backend):
#   GATEWAY_POLICY_FILE   policy JSON written by the controller
#   GATEWAY_PROXY_PORT    port the guest's HTTP(S)_PROXY points at
#   GATEWAY_DECISION_LOG  JSONL decision log the controller collects
set -eu
exec /opt/desktop-sandbox/bin/python -m controller.gateway serve \
  --policy "$GATEWAY_POLICY_FILE" \
  --port "$GATEWAY_PROXY_PORT" \
  --decision-log "$GATEWAY_DECISION_LOG"
