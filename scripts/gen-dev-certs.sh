#!/bin/sh
# Development certificates for dsv4serve's gRPC mutual TLS (openssl only; NOT for production).
#
#   scripts/gen-dev-certs.sh OUT_DIR [NAME ...]     (default names: worker scheduler frontend client)
#
# Writes OUT_DIR/ca.pem (the CA every service trusts: --tls-ca), and for each NAME a key and a
# certificate signed by that CA: OUT_DIR/NAME.key, OUT_DIR/NAME.pem (--tls-key / --tls-cert).
# Every certificate is valid as server and as client (one identity per service: the scheduler
# presents the same one to frontends and to workers) for the host names NAME and localhost and the
# address 127.0.0.1 — so it works for `dsv4serve stack` and for compose services named after it.
# Keys are ECDSA P-256; certificates last 30 days. The CA's key (ca.key) stays in OUT_DIR: keep
# it away from the services.
set -eu

if [ $# -lt 1 ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
out=$1
shift
[ $# -gt 0 ] || set -- worker scheduler frontend client
mkdir -p "$out"
days=30

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
  -subj "/CN=dsv4serve dev CA" -keyout "$out/ca.key" -out "$out/ca.pem" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>/dev/null

for name in "$@"; do
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$out/$name.key" -out "$out/$name.csr" 2>/dev/null
  printf '%s\n' \
    "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth,clientAuth" \
    "subjectAltName=DNS:$name,DNS:localhost,IP:127.0.0.1" > "$out/$name.ext"
  openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial \
    -days "$days" -extfile "$out/$name.ext" -out "$out/$name.pem" 2>/dev/null
  rm -f "$out/$name.csr" "$out/$name.ext"
  chmod 600 "$out/$name.key"
done
rm -f "$out/ca.srl"
chmod 600 "$out/ca.key"
echo "wrote $out/ca.pem and a key + certificate for: $*"
