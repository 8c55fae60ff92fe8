#!/usr/bin/env bash
# The system packages the test suite drives, from Debian's (or Ubuntu's) archive, installed where missing:
# chromium for the lens's browser tests (tests/test_lens_browser.py) and haproxy (in /usr/sbin) for the
# load-balancer tests (tests/test_serve_lb.py). As root, or through sudo. The README's quick start and
# .ci/run run it as `bash requirements/debian-packages.sh`.
set -euo pipefail
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing="$missing haproxy"
[ -z "$missing" ] && exit 0
as_root=""
[ "$(id -u)" = 0 ] || as_root="sudo"
echo "installing Debian's packages:$missing" >&2
$as_root apt-get update -qq
$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
