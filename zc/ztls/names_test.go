package ztls

import (
	"crypto/tls"
	"net"

	"github.com/zcnet/zcnet/internal/ktls"
)

// The record layer's names the tests use (the code lives in internal/ktls).
const (
	typeHandshake       = ktls.TypeHandshake
	typeAlert           = ktls.TypeAlert
	typeApplicationData = ktls.TypeApplicationData

	msgHelloRequest     = 0
	msgNewSessionTicket = 4
	msgKeyUpdate        = 24
)

type suite = ktls.Suite

var (
	suites        = ktls.Suites
	expandLabel   = ktls.ExpandLabel
	prf12         = ktls.PRF12
	nextSecret13  = ktls.NextSecret13
	trafficKeys13 = ktls.TrafficKeys13
)

// serverConn is Server with a config that already went through serverConfig.
func serverConn(raw net.Conn, cfg *tls.Config) *Conn {
	c := newConn(raw, false, nil)
	c.hs = ktls.Server(raw, cfg)
	c.tc = c.hs.TC
	return c
}
