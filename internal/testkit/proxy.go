package testkit

import (
	"errors"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy is a TCP forwarder between a server and its database that a test can cut and stall,
// so one server loses its database without stopping the PostgreSQL server other test
// packages share:
//
//   - down (SetDown): every open connection is closed and new ones are closed at once, as
//     when the database host goes away;
//   - stalled (SetStalled): connections stay open and new ones are accepted, but no byte is
//     forwarded, as a PostgreSQL that hangs (or a network that drops packets without a reset)
//     looks.
type Proxy struct {
	ln net.Listener

	mu      sync.Mutex
	target  string
	down    bool
	stalled bool
	flowing *sync.Cond // signalled when stalled becomes false
	conns   map[net.Conn]struct{}
}

// NewProxy listens on 127.0.0.1:0 until tb ends and forwards each connection to target
// (host:port; "" until SetTarget or Via sets it).
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("proxy: listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.flowing = sync.NewCond(&p.mu)
	go p.serve()
	tb.Cleanup(func() {
		_ = ln.Close()
		p.SetStalled(false)
		p.SetDown(true)
	})
	return p
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget sets the address new connections are forwarded to.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Via returns the database URL dbURL with its host replaced by the proxy's address, and, if
// the proxy has no target yet, makes dbURL's host its target.
func (p *Proxy) Via(tb testing.TB, dbURL string) string {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil || u.Host == "" {
		tb.Fatalf("proxy: database URL %q has no host: %v", dbURL, err)
	}
	p.mu.Lock()
	if p.target == "" {
		p.target = u.Host
	}
	p.mu.Unlock()
	u.Host = p.Addr()
	return u.String()
}

// SetDown switches the proxy off (closing every open connection; new ones are closed at once)
// or on again.
func (p *Proxy) SetDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			_ = c.Close()
		}
		clear(p.conns)
	}
}

// SetStalled stops (true) or resumes (false) forwarding bytes; connections stay open.
func (p *Proxy) SetStalled(stalled bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = stalled
	if !stalled {
		p.flowing.Broadcast()
	}
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		} else if err != nil {
			continue
		}
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	p.mu.Lock()
	if p.down || p.target == "" {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.pipe(up, c); done <- struct{}{} }()
	go func() { p.pipe(c, up); done <- struct{}{} }()
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// pipe copies src to dst, holding each chunk while the proxy is stalled, and closes both when
// either side ends.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled {
				p.flowing.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
