package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// run executes the command line against the given environment and returns stdout and stderr.
func run(t *testing.T, vars map[string]string, stdin string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := Execute(context.Background(), args, Env{Getenv: env(vars), Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut})
	return out.String(), errOut.String(), err
}

// eachDialect runs fn with the environment of a fresh SQLite file and of a fresh PostgreSQL
// database.
func eachDialect(t *testing.T, fn func(t *testing.T, vars map[string]string)) {
	t.Run("sqlite", func(t *testing.T) {
		fn(t, map[string]string{"IDEMGATE_SQLITE_PATH": filepath.Join(t.TempDir(), "cli.db"), "IDEMGATE_LOG_FORMAT": "json"})
	})
	t.Run("postgres", func(t *testing.T) {
		url, drop, err := modeltest.CreatePostgres()
		require.NoError(t, err)
		t.Cleanup(drop)
		fn(t, map[string]string{"DATABASE_URL": url, "IDEMGATE_LOG_FORMAT": "json"})
	})
}

func TestAPIKeyCreatePrintsOnlyTheSecret(t *testing.T) {
	eachDialect(t, func(t *testing.T, vars map[string]string) {
		out, _, err := run(t, vars, "", "apikey", "create", "--tenant", "shop", "--label", "checkout")
		require.NoError(t, err)
		require.Regexp(t, regexp.MustCompile(`^idg_[A-Za-z0-9_-]{43}\n$`), out)
		secret := strings.TrimSpace(out)

		db, err := models.Open(context.Background(), models.OpenOptions{DatabaseURL: vars["DATABASE_URL"], SQLitePath: vars["IDEMGATE_SQLITE_PATH"]})
		require.NoError(t, err)
		defer db.Close()
		auth := services.NewAuth(db, nil)
		p, err := auth.Authenticate(context.Background(), secret)
		require.NoError(t, err)
		require.Equal(t, secret[:12], p.Prefix)

		out, _, err = run(t, vars, "", "apikey", "revoke", p.Prefix)
		require.NoError(t, err)
		require.Equal(t, "revoked 1 API key(s)\n", out)
		_, _, err = run(t, vars, "", "apikey", "revoke", p.Prefix)
		require.Error(t, err, "nothing left to revoke")

		_, _, err = run(t, vars, "", "apikey", "create")
		require.Error(t, err, "--tenant is required")
		_, _, err = run(t, vars, "", "apikey", "create", "--tenant", "bad name")
		require.Error(t, err)
	})
}

func TestOperatorCreate(t *testing.T) {
	eachDialect(t, func(t *testing.T, vars map[string]string) {
		out, _, err := run(t, vars, "a-long-enough-password\n", "operator", "create", "--username", "alice", "--role", "operator")
		require.NoError(t, err)
		require.Equal(t, "created operator \"alice\"\n", out)
		_, _, err = run(t, vars, "short\n", "operator", "create", "--username", "bob", "--role", "auditor")
		require.ErrorContains(t, err, "password")
		_, _, err = run(t, vars, "a-long-enough-password\n", "operator", "create", "--username", "carol", "--role", "root")
		require.ErrorContains(t, err, "role")
		_, _, err = run(t, vars, "a-long-enough-password\n", "operator", "create", "--username", "dave", "--role", "auditor", "--tenant", "nope")
		require.ErrorContains(t, err, "tenant")
		v := map[string]string{"IDEMGATE_PASSWORD": "from-the-environment"}
		for k, val := range vars {
			v[k] = val
		}
		out, _, err = run(t, v, "", "operator", "create", "--username", "erin", "--role", "admin")
		require.NoError(t, err)
		require.Contains(t, out, "erin")
	})
}

func TestMigrateAndReap(t *testing.T) {
	eachDialect(t, func(t *testing.T, vars map[string]string) {
		_, _, err := run(t, vars, "", "migrate")
		require.NoError(t, err)
		out, _, err := run(t, vars, "", "reap")
		require.NoError(t, err)
		require.Equal(t, "holds_expired=0 marked_uncertain=0 operations_purged=0 attempts_purged=0 events_purged=0 tombstones_written=0 sessions_purged=0\n", out)
		_, _, err = run(t, map[string]string{"IDEMGATE_MAX_TTL": "never"}, "", "migrate")
		require.ErrorContains(t, err, "IDEMGATE_MAX_TTL")
	})
}
