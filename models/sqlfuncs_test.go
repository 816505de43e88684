package models_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// TestSQLRevisionIsCurrent: the files under models/sql are the revision models.sqlRevisions
// names last. A change to a file without a new entry would reach no database that already has
// the revision (applySQL skips an equal revision), and two builds would disagree about it.
func TestSQLRevisionIsCurrent(t *testing.T) {
	sum, err := models.SQLChecksum()
	require.NoError(t, err)
	last := models.SQLRevisions[len(models.SQLRevisions)-1]
	require.Equal(t, last, sum, "models/sql changed: append %q to sqlRevisions in models/sqlfuncs.go (revision %d)",
		sum, len(models.SQLRevisions))
}

// eachFreshDB runs fn on a migrated database of each dialect that no other test uses, since
// these tests rewrite functions and triggers.
func eachFreshDB(t *testing.T, fn func(t *testing.T, db *models.DB)) {
	for _, opts := range []models.OpenOptions{{DatabaseURL: freshDB(t)}, {SQLitePath: filepath.Join(t.TempDir(), "r.db")}} {
		db, err := models.Open(context.Background(), opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		t.Run(string(db.Dialect), func(t *testing.T) {
			_, err := models.Migrate(context.Background(), db, nil)
			require.NoError(t, err)
			fn(t, db)
		})
	}
}

// TestSQLRevisionRules: the rules applySQL follows between builds of adjacent revisions on
// one database, as in a rolling upgrade. A newer revision is applied and recorded, an older
// build leaves it in place (it must not put back functions the newer instances rely on), the
// same revision applies nothing, and the same revision with other contents is refused.
func TestSQLRevisionRules(t *testing.T) {
	ctx := context.Background()
	eachFreshDB(t, func(t *testing.T, db *models.DB) {
		recorded := func() (rev int, sum string) {
			row := db.Raw("SELECT revision, checksum FROM idemgate_sql").Row()
			require.NoError(t, row.Scan(&rev, &sum))
			return rev, sum
		}
		cur := models.SQLRevisions
		sum := cur[len(cur)-1]
		rev, got := recorded()
		require.Equal(t, len(cur)-1, rev, "Migrate recorded this build's revision")
		require.Equal(t, sum, got)

		applied, err := models.ApplySQL(ctx, db, cur, sum, nil)
		require.NoError(t, err)
		require.False(t, applied, "the same revision was applied again")

		next := append(append([]string{}, cur...), "next-"+sum)
		applied, err = models.ApplySQL(ctx, db, next, next[len(next)-1], nil)
		require.NoError(t, err)
		require.True(t, applied, "a newer revision was not applied")
		rev, got = recorded()
		require.Equal(t, len(next)-1, rev)
		require.Equal(t, next[len(next)-1], got)

		// This build's Migrate beside the newer instance: nothing changes.
		_, err = models.Migrate(ctx, db, nil)
		require.NoError(t, err)
		rev, _ = recorded()
		require.Equal(t, len(next)-1, rev, "an older build overwrote a newer revision")

		// Another build of the newer revision with other files.
		applied, err = models.ApplySQL(ctx, db, next, "other", nil)
		require.ErrorIs(t, err, models.ErrSQLRevisionConflict)
		require.False(t, applied)
	})
}

// TestSQLFilesReapplied: a database that records an older revision gets every function and
// trigger back from the files, whatever it had: here a trigger and (on PostgreSQL) the batch
// function are dropped, the revision set back, and Migrate puts them back and they work.
func TestSQLFilesReapplied(t *testing.T) {
	ctx := context.Background()
	eachFreshDB(t, func(t *testing.T, db *models.DB) {
		triggers := map[models.Dialect]string{
			models.Postgres: "SELECT count(*) FROM pg_trigger WHERE tgname = 'operations_uncertain_at'",
			models.SQLite:   "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name = 'operations_uncertain_at'",
		}[db.Dialect]
		count := func(q string) (n int) {
			require.NoError(t, db.Raw(q).Row().Scan(&n))
			return n
		}
		require.Equal(t, 1, count(triggers))
		require.NoError(t, db.Exec("DROP TRIGGER operations_uncertain_at"+map[models.Dialect]string{
			models.Postgres: " ON operations", models.SQLite: ""}[db.Dialect]).Error)
		if db.Dialect == models.Postgres {
			require.NoError(t, db.Exec("DROP FUNCTION idemgate_acquire_batch(bigint[], text[], integer[], text[], text[], "+
				"text[], text[], text[], text[], uuid[], text[], bigint[], integer[], text[], bigint[], bigint[], text)").Error)
		}
		require.NoError(t, db.Exec("UPDATE idemgate_sql SET revision = revision - 1").Error)
		_, err := models.Migrate(ctx, db, nil)
		require.NoError(t, err)
		require.Equal(t, 1, count(triggers), "the trigger was not put back")
		if db.Dialect == models.Postgres {
			// The current signature and revision 2's (a wrapper kept for a rolling upgrade).
			require.Equal(t, 2, count("SELECT count(*) FROM pg_proc WHERE proname = 'idemgate_acquire_batch'"))
			for key, extra := range map[string]string{"k": "", "k2": ", ARRAY[NULL::bigint], ARRAY[NULL::bigint]"} {
				var r string
				require.NoError(t, db.Raw(`SELECT result FROM idemgate_acquire_batch(ARRAY[1::bigint], ARRAY['`+key+`'],
				  ARRAY[60], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text],
				  ARRAY['c'], ARRAY[gen_random_uuid()], ARRAY['hash'], ARRAY[NULL::bigint], ARRAY[NULL::integer],
				  ARRAY[NULL::text]`+extra+`)`).Row().Scan(&r))
				require.Equal(t, "admitted", r, key)
			}
			var cfg string
			require.NoError(t, db.Raw(`SELECT array_to_string(proconfig, ',') FROM pg_proc
			  WHERE proname = 'idemgate_acquire_batch' AND pronargs = 17`).Row().Scan(&cfg))
			require.Equal(t, "plan_cache_mode=force_generic_plan", cfg)
		}
		rev := 0
		require.NoError(t, db.Raw("SELECT revision FROM idemgate_sql").Row().Scan(&rev))
		require.Equal(t, len(models.SQLRevisions)-1, rev)
	})
}

// TestPreBaselineDatabaseRefused: a database the pre-release migration chain left short of its
// last version would get the baseline's CREATE TABLEs over its own tables; Migrate refuses it
// with ErrPreBaseline before touching it.
func TestPreBaselineDatabaseRefused(t *testing.T) {
	ctx := context.Background()
	eachFreshDB(t, func(t *testing.T, db *models.DB) {
		require.NoError(t, db.Exec("DELETE FROM goose_db_version WHERE version_id > 0").Error)
		for v := 1; v <= 9; v++ {
			require.NoError(t, db.Exec("INSERT INTO goose_db_version (version_id, is_applied) VALUES (?, ?)", v, true).Error)
		}
		_, err := models.Migrate(ctx, db, nil)
		require.ErrorIs(t, err, models.ErrPreBaseline)
		require.ErrorContains(t, err, fmt.Sprint("version ", 9))
	})
}
