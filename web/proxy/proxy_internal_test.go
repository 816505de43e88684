package proxy

import "testing"

// TestUnderAnyMatchesWholeSegments: --require-key /orders covers /orders and what is below it,
// never /orders-archive (a raw string prefix refused those without a key).
func TestUnderAnyMatchesWholeSegments(t *testing.T) {
	for path, want := range map[string]bool{"/orders": true, "/orders/7": true, "/orders/": true,
		"/orders-archive": false, "/ordersX": false, "/order": false, "/": false} {
		if got := underAny(path, []string{"/orders"}); got != want {
			t.Errorf("underAny(%q, /orders) = %v, want %v", path, got, want)
		}
	}
	if !underAny("/anything", []string{"/"}) {
		t.Error(`"/" covers every path`)
	}
}

// FuzzUnderAny: a path is under a prefix exactly when it equals it or continues it with "/".
func FuzzUnderAny(f *testing.F) {
	f.Add("/orders/7", "/orders")
	f.Add("/orders-x", "/orders")
	f.Add("/", "/")
	f.Fuzz(func(t *testing.T, path, prefix string) {
		got := underAny(path, []string{prefix})
		p2 := prefix
		if len(p2) > 0 && p2[len(p2)-1] == '/' {
			p2 = p2[:len(p2)-1]
		}
		want := p2 == "" || path == p2 || (len(path) > len(p2) && path[:len(p2)] == p2 && path[len(p2)] == '/')
		if got != want {
			t.Fatalf("underAny(%q, %q) = %v, want %v", path, prefix, got, want)
		}
	})
}
