package forward

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestNotSent: what cannot have reached the upstream is told from what may have. A TLS
// handshake that failed sent no request (found by a breaker: such calls were left uncertain,
// their keys blocked until reconciled).
func TestNotSent(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer plain.Close()
	self := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer self.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	for name, url := range map[string]string{
		"refused":        closed,
		"https to plain": strings.Replace(plain.URL, "http://", "https://", 1),
		"untrusted cert": self.URL,
	} {
		_, err := (&http.Client{Transport: &http.Transport{}}).Get(url)
		if err == nil || !NotSent(err) {
			t.Errorf("%s: NotSent(%v) = false", name, err)
		}
	}
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close() // after reading the request
	}))
	defer cut.Close()
	if _, err := http.Post(cut.URL, "text/plain", strings.NewReader("x")); err == nil || NotSent(err) {
		t.Errorf("a connection cut after the request was read: NotSent(%v) = true", err)
	}
}
