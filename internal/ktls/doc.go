// Package ktls moves a TLS connection's records into the kernel after crypto/tls ran its
// handshake: the record-exact handshake reader (nothing past the peer's Finished stays in
// crypto/tls), the secrets from crypto/tls's key log, the kernel's keys, IVs and sequence
// numbers of both directions (TLS 1.2 and 1.3; AES-GCM and ChaCha20-Poly1305), and the
// handling of the non-data records the kernel hands over afterwards (alerts, KeyUpdate,
// session tickets, renegotiation requests). It is shared by the net.Conn face (zc/ztls)
// and the event-loop API (zc's TLS option), so both behave alike and report the same
// error types (*AlertError, ErrRenegotiation).
package ktls
