package proxy

import (
	"testing"

	"github.com/idemgate/idemgate/web/client"
)

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

// FuzzParseOperations: what ParseOperations accepts is a list of whole-segment prefixes and
// valid operation names, and writing them back as PREFIX=NAME reads the same list again.
func FuzzParseOperations(f *testing.F) {
	f.Add("/v1/charges=charge.create", "/=x")
	f.Add("a=b", "/a=")
	f.Add("/a/=x", "/a=y")
	f.Fuzz(func(t *testing.T, a, b string) {
		ops, err := ParseOperations([]string{a, b})
		if err != nil {
			return
		}
		var again []string
		for _, o := range ops {
			if !client.ValidOperationName(o.Name) || (o.Prefix != "" && o.Prefix[0] != '/') ||
				(len(o.Prefix) > 0 && o.Prefix[len(o.Prefix)-1] == '/') {
				t.Fatalf("accepted %q, %q as %+v", a, b, o)
			}
			again = append(again, o.Prefix+"="+o.Name)
		}
		ops2, err := ParseOperations(again)
		if err != nil || len(ops2) != len(ops) {
			t.Fatalf("%q read back as %+v, %v", again, ops2, err)
		}
		for i := range ops {
			if ops[i] != ops2[i] {
				t.Fatalf("%q read back as %+v", again, ops2)
			}
		}
	})
}
