package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPolicyCommands: set stores a policy (durations as elsewhere: 90d, 1h, 1s), list shows
// it, set again replaces it whole, delete removes it and refuses a second time; bad input is
// refused with the field named, and a typo never creates a tenant.
func TestPolicyCommands(t *testing.T) {
	eachDialect(t, func(t *testing.T, vars map[string]string) {
		_, _, err := run(t, vars, "", "apikey", "create", "--tenant", "shop")
		require.NoError(t, err)
		_, _, err = run(t, vars, "", "policy", "set", "--tenant", "Shop", "--ttl", "1h")
		require.ErrorContains(t, err, "tenant: there is no tenant")
		_, _, err = run(t, vars, "", "policy", "set", "--tenant", "shop", "--ttl", "1h", "--lease", "2h", "--on-expiry", "never")
		require.ErrorContains(t, err, "lease: must not be longer than ttl")
		require.ErrorContains(t, err, "on_expiry: must be readmit or hold_until_reconciled")
		_, _, err = run(t, vars, "", "policy", "set", "--tenant", "shop", "--ttl", "soon")
		require.ErrorContains(t, err, `--ttl: "soon" is not a duration such as 90d, 1h, 30s or 3600 (seconds), at most 100 years`)
		_, _, err = run(t, vars, "", "policy", "set", "--tenant", "shop")
		require.ErrorContains(t, err, "sets nothing")

		_, errOut, err := run(t, vars, "", "policy", "set", "--tenant", "shop", "--ttl", "90d", "--on-expiry", "hold_until_reconciled")
		require.NoError(t, err)
		require.Contains(t, errOut, `policy set for tenant "shop", every operation: ttl 90d, lease -, on_expiry hold_until_reconciled, retention -, horizon -`)
		_, _, err = run(t, vars, "", "policy", "set", "--tenant", "shop", "--operation", "refund", "--retention", "30d", "--horizon", "1d")
		require.ErrorContains(t, err, "horizon: must not be shorter than retention")
		_, _, err = run(t, vars, "", "policy", "set", "--tenant", "shop", "--operation", "refund", "--retention", "1s", "--horizon", "400d")
		require.NoError(t, err)
		_, _, err = run(t, vars, "", "policy", "set", "--tenant", "shop", "--operation", "charge", "--ttl", "1s", "--lease", "1s")
		require.NoError(t, err)

		out, _, err := run(t, vars, "", "policy", "list")
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 4, out)
		require.Regexp(t, `^shop\s+\*\s+90d\s+-\s+hold_until_reconciled\s+-\s+-\s+cli\s`, lines[1])
		require.Regexp(t, `^shop\s+charge\s+1s\s+1s\s+-\s+-\s+-\s+cli\s`, lines[2])
		require.Regexp(t, `^shop\s+refund\s+-\s+-\s+-\s+1s\s+400d\s+cli\s`, lines[3])

		_, _, err = run(t, vars, "", "policy", "set", "--tenant", "shop", "--operation", "charge", "--on-expiry", "readmit")
		require.NoError(t, err)
		out, _, _ = run(t, vars, "", "policy", "list", "--tenant", "shop")
		require.Regexp(t, `(?m)^shop\s+charge\s+-\s+-\s+readmit\s+-\s+-\s`, out, "set replaces the policy whole")

		_, _, err = run(t, vars, "", "policy", "delete", "--tenant", "shop", "--operation", "charge")
		require.NoError(t, err)
		_, _, err = run(t, vars, "", "policy", "delete", "--tenant", "shop", "--operation", "charge")
		require.ErrorContains(t, err, "no policy for this tenant and operation")
		out, _, _ = run(t, vars, "", "policy", "list", "--tenant", "shop")
		require.NotContains(t, out, "charge")
		_, _, err = run(t, vars, "", "policy", "list", "--tenant", "nope")
		require.Error(t, err)
	})
}
