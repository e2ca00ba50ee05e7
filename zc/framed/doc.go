// Package framed parses framed protocols over the Data a zc connection receives without
// copying payloads: a Reader takes the received buffers in, whatever their boundaries, and
// gives out headers (Peek, Span) and whole messages (Next) as references to the received
// memory, which a reply can send as it is (Message.SendTo, a vectored zc.Conn.SendData).
//
// It is built on zc's public API only (Data.Slice, Data.Release, Conn.SendData): an
// application could write the same Reader. Example (package doc) is a whole handler of a
// length-prefixed protocol; README.md shows the same code.
//
// Errors: Skip and Next past what is available are zc.ErrInvalid (nothing consumed), Next(0)
// is zc.ErrEmpty, and Next over Data that cannot be sliced (zcrx) is zc.ErrNotSupported.
package framed
