//go:build unix

package web

import (
	"net"
	"syscall"
	"time"
)

// peerCheckEvery is how often a waiting request looks whether its client hung up.
const peerCheckEvery = 250 * time.Millisecond

// peerGone returns a channel closed once the peer of conn has closed the connection (the
// client of a waiting request went away), and closed never if conn is not a socket. fasthttp
// does not say when a client disconnects, so this peeks at the socket (MSG_PEEK: no bytes are
// consumed, a pipelined next request stays for the server) every peerCheckEvery: a read of 0
// bytes without error is the peer's FIN. It stops looking when stop is closed (the wait
// ended).
func peerGone(conn net.Conn, stop <-chan struct{}) <-chan struct{} {
	gone := make(chan struct{})
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return gone
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return gone
	}
	go func() {
		buf := make([]byte, 1)
		t := time.NewTicker(peerCheckEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			closed := false
			// Control, not Read: the server's read deadline on the connection (set when the
			// request was read) must not be taken for a hang-up, and MSG_DONTWAIT never blocks.
			if err := rc.Control(func(fd uintptr) {
				n, _, rerr := syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
				closed = n == 0 && rerr == nil
				if rerr != nil && rerr != syscall.EAGAIN && rerr != syscall.EINTR {
					closed = true
				}
			}); err != nil || closed {
				close(gone)
				return
			}
		}
	}()
	return gone
}
