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

// FuzzParseUpstream: whatever --upstream holds, ParseUpstream refuses it or returns an http or
// https URL with a host, never a relative or schemeless one that would send requests nowhere.
func FuzzParseUpstream(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:9000", "https://api.example/v1", "127.0.0.1:9000", "/relative",
		"ftp://x", "http://", "http:///path", "HTTP://Example", "http://[::1]:80/", "http://a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := ParseUpstream(raw)
		if err != nil {
			if u != nil || !strings.Contains(err.Error(), "upstream") {
				t.Fatalf("%q: %v, %v", raw, u, err)
			}
			return
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			t.Fatalf("%q accepted as %#v", raw, u)
		}
	})
}
