package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWebhookCommands: create prints only the secret, once; list never shows it; delete
// removes the endpoint from the list; bad input is refused with the field named.
func TestWebhookCommands(t *testing.T) {
	eachDialect(t, func(t *testing.T, vars map[string]string) {
		_, _, err := run(t, vars, "", "apikey", "create", "--tenant", "shop")
		require.NoError(t, err)
		_, _, err = run(t, vars, "", "webhook", "create", "--tenant", "Shop", "--url", "https://h.example/x", "--events", "operation.uncertain")
		require.ErrorContains(t, err, "tenant: there is no tenant", "a typo never creates a tenant")
		_, _, err = run(t, vars, "", "webhook", "create", "--tenant", "shop", "--url", "http://h.example/x", "--events", "operation.nope")
		require.ErrorContains(t, err, "url: must use https://")
		require.ErrorContains(t, err, "events: unknown event")

		out, errOut, err := run(t, vars, "", "webhook", "create", "--tenant", "shop", "--url", "http://127.0.0.1:9/hook",
			"--events", "operation.reconciled, operation.uncertain")
		require.NoError(t, err)
		require.Regexp(t, regexp.MustCompile(`^whsec_[A-Za-z0-9+/]{43}=\n$`), out)
		require.Contains(t, errOut, "created webhook endpoint 1")
		secret := strings.TrimSpace(out)

		out, _, err = run(t, vars, "", "webhook", "list", "--tenant", "shop")
		require.NoError(t, err)
		require.Contains(t, out, "operation.uncertain,operation.reconciled")
		require.Contains(t, out, "http://127.0.0.1:9/hook")
		require.Contains(t, out, "active")
		require.NotContains(t, out, secret)
		require.NotContains(t, out, "whsec_")

		out, _, err = run(t, vars, "", "webhook", "disable", "1")
		require.NoError(t, err)
		require.Equal(t, "disabled webhook endpoint 1\n", out)
		out, _, _ = run(t, vars, "", "webhook", "list")
		require.Contains(t, out, "disabled")

		out, _, err = run(t, vars, "", "webhook", "delete", "1")
		require.NoError(t, err)
		require.Equal(t, "deleted webhook endpoint 1\n", out)
		_, _, err = run(t, vars, "", "webhook", "delete", "1")
		require.ErrorContains(t, err, "no webhook endpoint 1")
		out, _, _ = run(t, vars, "", "webhook", "list")
		require.NotContains(t, out, "127.0.0.1:9")
		_, _, err = run(t, vars, "", "webhook", "list", "--tenant", "nope")
		require.Error(t, err)
	})
}
