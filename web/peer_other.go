//go:build !unix

package web

import "net"

// peerGone is not available off Unix: a waiting request then ends at its wait's end or at
// shutdown.
func peerGone(net.Conn, <-chan struct{}) <-chan struct{} { return make(chan struct{}) }
