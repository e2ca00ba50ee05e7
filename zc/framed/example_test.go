package framed_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/framed"
)

// echoFrames is a handler for a length-prefixed protocol (a 4-byte big-endian length, then the
// payload) that answers each message with its payload: parsed with a framed.Reader wherever the
// receive buffers split the messages, and sent back as references to the received buffers.
type echoFrames struct{ r framed.Reader }

// reader:begin
func (h *echoFrames) OnData(c *zc.Conn, d zc.Data) {
	h.r.Push(d) // the Reader owns d now
	var hdr [4]byte
	for h.r.Peek(hdr[:]) == len(hdr) {
		n := int(binary.BigEndian.Uint32(hdr[:]))
		if h.r.Len() < len(hdr)+n {
			return // the rest of the message comes in a later Data
		}
		h.r.Skip(len(hdr))
		msg, err := h.r.Next(n) // references to the received bytes, no copy
		if err != nil {
			c.Close()
			return
		}
		if err := msg.SendTo(c); err != nil { // a vectored send of the held buffers
			c.Close()
			return
		}
	}
}

func (h *echoFrames) OnEOF(c *zc.Conn, err error) { c.Close() }

func (h *echoFrames) OnClose(c *zc.Conn, err error) { h.r.Release() }

// reader:end

// A framed protocol parsed without copying its payloads: messages split across receive
// buffers (here: sent a few bytes at a time) come out whole, and each reply is the
// message's own received memory.
func Example() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler { return &echoFrames{} })
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	var stream []byte
	for _, m := range []string{"zero ", "copy ", "framing\n"} {
		stream = binary.BigEndian.AppendUint32(stream, uint32(len(m)))
		stream = append(stream, m...)
	}
	go func() {
		for len(stream) > 0 { // 3 bytes at a time: every message is split
			k := min(3, len(stream))
			c.Write(stream[:k])
			stream = stream[k:]
		}
		c.(*net.TCPConn).CloseWrite()
	}()
	b, _ := io.ReadAll(c)
	fmt.Print(string(b))
	// Output:
	// zero copy framing
}
