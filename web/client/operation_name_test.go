package client_test

import (
	"testing"

	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web/client"
)

// FuzzValidOperationName: the client's check of an operation name (used by the proxy and the
// MCP gateway at start) accepts exactly what the server's rule accepts.
func FuzzValidOperationName(f *testing.F) {
	for _, s := range []string{"charge.create", "", "has space", "é", "a:b_c-d.e", string(make([]byte, 65))} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := client.ValidOperationName(name), services.ValidateOperationName(name) == ""; got != want {
			t.Fatalf("ValidOperationName(%q) = %v, the server's rule says %v", name, got, want)
		}
	})
}
