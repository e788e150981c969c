#!/usr/bin/env bash
# The system packages `make test` needs beyond Python 3.11, Java 17 and a C compiler, in
# one place (`make test` and .ci/run both come here): MIT Kerberos's headers (the gssapi
# package builds against them), its KDC, kadmin.local and kinit (the SASL/GSSAPI tests
# start a KDC on loopback: tests/kdc.py), and openssl (the TLS tests write PKCS12 stores).
# `make demo` needs none of them.
#
# As root on Debian or Ubuntu the missing ones are installed with apt-get; elsewhere the
# script prints the one command that installs them and fails, naming them.
set -euo pipefail

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v krb5-config >/dev/null 2>&1 || missing+=(libkrb5-dev)
[ -x /usr/sbin/krb5kdc ] || missing+=(krb5-kdc)
[ -x /usr/sbin/kadmin.local ] || missing+=(krb5-admin-server)
command -v kinit >/dev/null 2>&1 || missing+=(krb5-user)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing the system packages the suite needs: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
    exit 0
fi

echo "make test needs these system packages, missing here: ${missing[*]}" >&2
echo "install them (Debian/Ubuntu names; Red Hat: java-17-openjdk-headless gcc krb5-devel krb5-server krb5-workstation openssl), then run make test again:" >&2
echo "    sudo apt-get install ${missing[*]}" >&2
exit 1
