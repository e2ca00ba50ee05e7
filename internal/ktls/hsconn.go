package ktls

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

const (
	recordHeaderLen = 5
	maxRecordLen    = 16384 + 2048 // the largest ciphertext TLS allows (RFC 5246 §6.2.3)

	typeChangeCipherSpec = 20
	typeAlert            = 21
	typeHandshake        = 22
	typeApplicationData  = 23

	msgClientHello = 1
	msgServerHello = 2
)

// hsConn sits between crypto/tls and the socket during the handshake. It reads exactly
// one TLS record at a time from the socket and hands crypto/tls no byte past the record
// it asked for, so when the handshake ends every later record (a TLS 1.3 session ticket,
// the peer's first data) is still in the socket for the kernel to decrypt. It also sees
// the records that cross: the hello randoms, where the cipher changed and how many
// records went out under the traffic keys. After the handshake it passes bytes through
// (the user-space fallback) or is dropped (kernel TLS).
type hsConn struct {
	net.Conn
	isClient bool
	sec      *secrets

	rmu         sync.Mutex
	pending     []byte      // the rest of the record being handed to crypto/tls
	passthrough atomic.Bool // the handshake is over: read straight from the socket

	wmu     sync.Mutex
	carry   []byte // a partial record written (crypto/tls writes whole records; kept general)
	obs     observed
	routeID string // the client random this connection's key log lines carry
}

// observed is what hsConn saw of the handshake's records.
type observed struct {
	mu           sync.Mutex
	clientRandom []byte
	serverRandom []byte
	sent         []rec // records written, in order
	recv         []rec // records read, in order
}

type rec struct {
	typ uint8
	n   int // body length
}

func (c *hsConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.passthrough.Load() && len(c.pending) == 0 {
		return c.Conn.Read(p)
	}
	if len(c.pending) == 0 {
		if err := c.readRecord(); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// readRecord reads one whole record from the socket into pending.
func (c *hsConn) readRecord() error {
	var hdr [recordHeaderLen]byte
	if _, err := io.ReadFull(c.Conn, hdr[:]); err != nil {
		return err
	}
	n := int(binary.BigEndian.Uint16(hdr[3:]))
	if n > maxRecordLen {
		// Let crypto/tls see the header: it sends the right alert and fails.
		c.pending = hdr[:]
		return nil
	}
	buf := make([]byte, recordHeaderLen+n)
	copy(buf, hdr[:])
	if _, err := io.ReadFull(c.Conn, buf[recordHeaderLen:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	c.observe(false, hdr[0], buf[recordHeaderLen:])
	c.pending = buf
	return nil
}

func (c *hsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	if !c.passthrough.Load() {
		c.carry = append(c.carry, p...)
		for len(c.carry) >= recordHeaderLen {
			n := int(binary.BigEndian.Uint16(c.carry[3:]))
			if len(c.carry) < recordHeaderLen+n {
				break
			}
			c.observe(true, c.carry[0], c.carry[recordHeaderLen:recordHeaderLen+n])
			c.carry = c.carry[recordHeaderLen+n:]
		}
	}
	c.wmu.Unlock()
	return c.Conn.Write(p)
}

// observe notes a record: its type and size, and the randoms of the hellos (which start
// the first handshake record of each side; TLS 1.2 needs the server's for the key block,
// and the client's routes the key log).
func (c *hsConn) observe(sent bool, typ uint8, body []byte) {
	o := &c.obs
	o.mu.Lock()
	defer o.mu.Unlock()
	r := rec{typ, len(body)}
	if sent {
		o.sent = append(o.sent, r)
	} else {
		o.recv = append(o.recv, r)
	}
	if typ != typeHandshake || len(body) < 38 {
		return
	}
	switch body[0] {
	case msgClientHello:
		if o.clientRandom == nil {
			o.clientRandom = append([]byte{}, body[6:38]...)
			if !c.isClient && route(string(o.clientRandom), c.sec) {
				c.routeID = string(o.clientRandom)
			}
		}
	case msgServerHello:
		o.serverRandom = append(o.serverRandom[:0], body[6:38]...)
	}
}

// unroute stops routing key log lines to this connection.
func (c *hsConn) unroute() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.obs.mu.Lock()
	id := c.routeID
	c.obs.mu.Unlock()
	if id != "" {
		routes.Delete(id)
	}
}

// txSeq13 counts the records this side sent under its application traffic keys during
// the handshake: those after its Finished, the last encrypted record of 4+hash+1+16
// bytes (a Finished message, its content type byte and the AEAD tag; crypto/tls writes
// it alone and unpadded). Only a TLS 1.3 server sends any: its session ticket.
func (o *observed) txSeq13(s Suite) (uint64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fin := 4 + s.hash().Size() + 1 + 16
	last := -1
	for i, r := range o.sent {
		if r.typ == typeApplicationData && r.n == fin {
			last = i
		}
	}
	if last < 0 {
		return 0, fmt.Errorf("the handshake's Finished record (%d bytes) was not seen", fin)
	}
	n := uint64(0)
	for _, r := range o.sent[last+1:] {
		if r.typ == typeApplicationData {
			n++
		}
	}
	return n, nil
}

// afterCCS counts the records sent (or received) after ChangeCipherSpec: in TLS 1.2 the
// records under the new keys, the Finished (1).
func (o *observed) afterCCS(sent bool) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	rs := o.recv
	if sent {
		rs = o.sent
	}
	n, seen := uint64(0), false
	for _, r := range rs {
		if seen {
			n++
		}
		if r.typ == typeChangeCipherSpec {
			seen, n = true, 0
		}
	}
	return n
}
