#!/usr/bin/env bash
# Tests and the demo run Debian's real prometheus binary. Install it when missing.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "prometheus not found: installing Debian's package with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  exit 0
fi
echo "error: the tests and the demo need Prometheus (the 'prometheus' and 'promtool' binaries)." >&2
echo "       On Debian/Ubuntu: sudo apt-get install prometheus ; elsewhere put both on PATH." >&2
exit 1
