#!/usr/bin/env bash
# Runs a command with the test services up (see services.sh), then stops them. For example:
#   bash scripts/with-services.sh cargo bench -p syncguard --features postgres --bench postgres
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
start_services
"$@"
