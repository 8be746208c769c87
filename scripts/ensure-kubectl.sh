#!/usr/bin/env bash
# Tests drive the local stack with Debian's real kubectl (client-side validation, tables, explain,
# the kubectl-specops plugin). Install it when missing.
set -euo pipefail
if command -v kubectl >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "kubectl not found: installing Debian's package with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends kubectl >/dev/null
  exit 0
fi
echo "error: the tests use kubectl against the local stack." >&2
echo "       On Debian/Ubuntu: sudo apt-get install kubectl ; elsewhere put it on PATH." >&2
exit 1
