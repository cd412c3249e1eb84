#!/usr/bin/env bash
# Sets up the host and starts Vertal Run on its embedded default: the OCI
# driver, SQLite under /var/lib/vertal, and a development tenant whose key is
# printed on first start. Extra arguments go to `vertal serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh serve
exec bin/vertal serve --dev "$@"
