package cli

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// withVars returns vars plus extra, for one command.
func withVars(vars map[string]string, extra ...string) map[string]string {
	v := map[string]string{}
	for k, val := range vars {
		v[k] = val
	}
	for i := 0; i+1 < len(extra); i += 2 {
		v[extra[i]] = extra[i+1]
	}
	return v
}

// login reports whether username signs in with password on vars' database.
func login(t *testing.T, vars map[string]string, username, password string) bool {
	t.Helper()
	db, err := models.Open(context.Background(), models.OpenOptions{DatabaseURL: vars["DATABASE_URL"], SQLitePath: vars["IDEMGATE_SQLITE_PATH"]})
	require.NoError(t, err)
	defer db.Close()
	_, err = services.NewAuth(db, nil).Login(context.Background(), username, password)
	if errors.Is(err, services.ErrUnauthorized) {
		return false
	}
	require.NoError(t, err)
	return true
}

// lines splits a listing into its rows, each into its columns.
func lines(out string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		rows = append(rows, regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1))
	}
	return rows
}

// TestOperatorListDeletePasswd: list shows accounts without their hashes; delete removes an
// account but refuses the last global admin; passwd changes a password read from stdin.
func TestOperatorListDeletePasswd(t *testing.T) {
	eachDialect(t, func(t *testing.T, vars map[string]string) {
		_, _, err := run(t, vars, "", "apikey", "create", "--tenant", "shop")
		require.NoError(t, err)
		for _, a := range [][]string{{"root", "admin", ""}, {"alice", "operator", "shop"}, {"bob", "auditor", ""}} {
			args := []string{"operator", "create", "--username", a[0], "--role", a[1]}
			if a[2] != "" {
				args = append(args, "--tenant", a[2])
			}
			_, _, err := run(t, vars, "a-long-enough-password\n", args...)
			require.NoError(t, err)
		}
		out, _, err := run(t, vars, "", "operator", "list")
		require.NoError(t, err)
		rows := lines(out)
		require.Equal(t, []string{"USERNAME", "ROLE", "TENANT", "CREATED"}, rows[0])
		require.Len(t, rows, 4)
		require.Equal(t, []string{"alice", "operator", "shop"}, rows[1][:3])
		require.Equal(t, []string{"bob", "auditor", "(global)"}, rows[2][:3])
		require.Equal(t, []string{"root", "admin", "(global)"}, rows[3][:3])
		require.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`, rows[1][3])
		require.NotContains(t, out, "$2a$", "no bcrypt hash")

		// passwd: from stdin (piped), with --password-stdin, and from IDEMGATE_PASSWORD.
		out, _, err = run(t, vars, "a-brand-new-password\n", "operator", "passwd", "alice")
		require.NoError(t, err)
		require.Equal(t, "changed the password of \"alice\"\n", out)
		require.True(t, login(t, vars, "alice", "a-brand-new-password"))
		require.False(t, login(t, vars, "alice", "a-long-enough-password"))
		_, _, err = run(t, withVars(vars, "IDEMGATE_PASSWORD", "ignored-with-the-flag"), "via-the-stdin-flag\n", "operator", "passwd", "--password-stdin", "alice")
		require.NoError(t, err)
		require.True(t, login(t, vars, "alice", "via-the-stdin-flag"))
		_, _, err = run(t, withVars(vars, "IDEMGATE_PASSWORD", "from-the-environment"), "", "operator", "passwd", "alice")
		require.NoError(t, err)
		require.True(t, login(t, vars, "alice", "from-the-environment"))
		_, _, err = run(t, vars, "short\n", "operator", "passwd", "alice")
		require.ErrorContains(t, err, "password: must be 12 to 72 bytes")
		require.True(t, login(t, vars, "alice", "from-the-environment"), "a refused password changes nothing")
		_, _, err = run(t, vars, "", "operator", "passwd", "alice")
		require.ErrorContains(t, err, "no password")
		_, _, err = run(t, vars, "a-brand-new-password\n", "operator", "passwd", "nobody")
		require.ErrorContains(t, err, `no dashboard account is called "nobody"`)

		// delete: an ordinary account, an unknown one, the last global admin.
		out, _, err = run(t, vars, "", "operator", "delete", "bob")
		require.NoError(t, err)
		require.Equal(t, "deleted auditor \"bob\"\n", out)
		_, _, err = run(t, vars, "", "operator", "delete", "bob")
		require.ErrorContains(t, err, `no dashboard account is called "bob"`)
		_, _, err = run(t, vars, "", "operator", "delete", "root")
		require.ErrorContains(t, err, `refusing to delete "root": it is the last global admin account`)
		require.True(t, login(t, vars, "root", "a-long-enough-password"), "the last admin is still there")
		_, _, err = run(t, vars, "another-good-password\n", "operator", "create", "--username", "root2", "--role", "admin")
		require.NoError(t, err)
		_, _, err = run(t, vars, "", "operator", "delete", "root")
		require.NoError(t, err, "with another global admin the first may go")
		out, _, err = run(t, vars, "", "operator", "list")
		require.NoError(t, err)
		require.NotContains(t, out, "root ")
		require.Contains(t, out, "root2")
	})
}

// TestAPIKeyAndTenantList: apikey list shows prefixes, tenants, labels and revocation, never
// a secret or a hash, and filters by tenant; tenant list counts each tenant's keys.
func TestAPIKeyAndTenantList(t *testing.T) {
	eachDialect(t, func(t *testing.T, vars map[string]string) {
		out, _, err := run(t, vars, "", "tenant", "list")
		require.NoError(t, err)
		require.Equal(t, [][]string{{"NAME", "ACTIVE KEYS", "ALL KEYS", "CREATED"}}, lines(out), "no tenants yet")
		var secrets []string
		for _, k := range [][]string{{"shop", "checkout"}, {"shop", ""}, {"billing", "invoices"}} {
			args := []string{"apikey", "create", "--tenant", k[0]}
			if k[1] != "" {
				args = append(args, "--label", k[1])
			}
			out, _, err := run(t, vars, "", args...)
			require.NoError(t, err)
			secrets = append(secrets, strings.TrimSpace(out))
		}
		_, _, err = run(t, vars, "", "apikey", "revoke", secrets[0][:12])
		require.NoError(t, err)

		out, _, err = run(t, vars, "", "apikey", "list")
		require.NoError(t, err)
		rows := lines(out)
		require.Equal(t, []string{"PREFIX", "TENANT", "LABEL", "CREATED", "LAST USED", "REVOKED"}, rows[0])
		require.Len(t, rows, 4)
		byPrefix := map[string][]string{}
		for _, r := range rows[1:] {
			byPrefix[r[0]] = r
		}
		require.Equal(t, []string{secrets[0][:12], "shop", "checkout"}, byPrefix[secrets[0][:12]][:3])
		require.Regexp(t, `^\d{4}-`, byPrefix[secrets[0][:12]][5], "revoked")
		require.Equal(t, []string{secrets[1][:12], "shop", "-"}, byPrefix[secrets[1][:12]][:3])
		require.Equal(t, "-", byPrefix[secrets[1][:12]][5], "not revoked")
		require.Equal(t, []string{secrets[2][:12], "billing", "invoices"}, byPrefix[secrets[2][:12]][:3])
		for _, s := range secrets {
			require.NotContains(t, out, s, "no secret")
			require.NotContains(t, out, s[12:20], "no part of a secret beyond its prefix")
		}

		out, _, err = run(t, vars, "", "apikey", "list", "--tenant", "billing")
		require.NoError(t, err)
		rows = lines(out)
		require.Len(t, rows, 2)
		require.Equal(t, "billing", rows[1][1])
		_, _, err = run(t, vars, "", "apikey", "list", "--tenant", "nope")
		require.ErrorContains(t, err, `no tenant is called "nope"`)

		out, _, err = run(t, vars, "", "tenant", "list")
		require.NoError(t, err)
		rows = lines(out)
		require.Len(t, rows, 3)
		require.Equal(t, []string{"billing", "1", "1"}, rows[1][:3])
		require.Equal(t, []string{"shop", "1", "2"}, rows[2][:3])
		require.Regexp(t, `^\d{4}-\d\d-\d\dT`, rows[2][3])
	})
}

// TestPromptTwice: a password typed at the prompt counts only when both entries agree.
func TestPromptTwice(t *testing.T) {
	answers := func(a ...string) func() (string, error) {
		return func() (string, error) { s := a[0]; a = a[1:]; return s, nil }
	}
	var prompts strings.Builder
	pw, err := promptTwice(answers("same-password-1", "same-password-1"), &prompts)
	require.NoError(t, err)
	require.Equal(t, "same-password-1", pw)
	require.Contains(t, prompts.String(), "New password: ")
	require.Contains(t, prompts.String(), "Repeat it: ")
	_, err = promptTwice(answers("same-password-1", "same-passwrod-1"), &prompts)
	require.ErrorIs(t, err, services.ErrPasswordMismatch)
}

// TestVersion: version prints the module version and the Go release without a database.
func TestVersion(t *testing.T) {
	out, _, err := run(t, map[string]string{"IDEMGATE_SQLITE_PATH": "/nonexistent/dir/x.db"}, "", "version")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^idemgate \S+\nrevision .+\ntime     .+\ngo       go1\.`, out)
}
