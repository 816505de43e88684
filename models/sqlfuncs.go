package models

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
)

// sqlSources holds the current source of every SQL function and trigger, one file per
// function or trigger (with the trigger functions it runs), per dialect. Versioned migrations
// hold the schema only; these files are reapplied whole when they change, as River keeps its
// queries in dbsqlc/*.sql, so reading today's behaviour never means finding the newest copy in
// a migration chain.
//
//go:embed sql
var sqlSources embed.FS

// sqlRevisions is the history of models/sql's contents: entry r is the SHA-256 (sqlChecksum)
// of the files of revision r, both dialects together; the current revision is the last
// entry. When a file changes, append its new checksum (TestSQLRevisionIsCurrent fails until
// you do, and says what to append); never edit an entry. A rolling upgrade runs two adjacent
// revisions side by side, so a change must keep every signature the previous revision's Go
// code calls (add an overload; drop the old one a revision later).
var sqlRevisions = []string{
	0: "", // no files applied
	1: "c1cc593d00b9caf58af95b464768bbae57b0b01c4a46fc7e5a2e0315a6cf0bdb",
	2: "9f65153dc17a8be0fcad8a5eae28b55ccdc8919174d84f8a99c5530c6721d1c1", // idemgate_rules.sql: same request, may duplicate an effect
	3: "1dc427497433367b65cf6ee2972f8a009dd88bab177cf777254e54e07bda5751", // lifecycle: retention, horizon, tombstones (16-argument idemgate_acquire)
	4: "b706278c605bef7b473900ab6a3b2c893f2668563144eb622e9595c645beef77", // a success protects its key whether or not it is the newest (protected_by)
	5: "f157bcd0795a02c1e0866bdf542898888b7653067a4d97477983a118fbfca2af", // previous_operation: the newest generation that may have had its effect
}

// sqlLockID is the PostgreSQL advisory lock that serialises applying the files, so two
// instances starting at once do not interleave their CREATE OR REPLACE statements. It differs
// from goose's migration lock, which is released before the files are applied.
const sqlLockID int64 = 0x69646d5f73716c // "idm_sql"

// ErrSQLRevisionConflict is returned by Migrate when the database records this build's
// revision of models/sql with another checksum: two builds disagree about what that revision
// is, and neither may overwrite the other's functions.
var ErrSQLRevisionConflict = errors.New("models/sql: the database has this revision of the functions and triggers with other contents")

// sqlFiles returns dialect's function and trigger files in name order, the order they are
// applied in.
func sqlFiles(dialect Dialect) ([]string, map[string]string, error) {
	dir := path.Join("sql", string(dialect))
	entries, err := fs.ReadDir(sqlSources, dir)
	if err != nil {
		return nil, nil, err
	}
	var names []string
	bodies := map[string]string{}
	for _, e := range entries {
		b, err := fs.ReadFile(sqlSources, path.Join(dir, e.Name()))
		if err != nil {
			return nil, nil, err
		}
		names = append(names, e.Name())
		bodies[e.Name()] = string(b)
	}
	sort.Strings(names)
	return names, bodies, nil
}

// sqlChecksum is the hex SHA-256 over every file of both dialects (dialect, name and contents
// of each, length-prefixed), so one revision number covers both.
func sqlChecksum() (string, error) {
	h := sha256.New()
	for _, d := range []Dialect{Postgres, SQLite} {
		names, bodies, err := sqlFiles(d)
		if err != nil {
			return "", err
		}
		for _, n := range names {
			fmt.Fprintf(h, "%s/%s %d\n%s", d, n, len(bodies[n]), bodies[n])
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// applySQL brings d's functions and triggers to this build's revision (the last entry of
// revisions, whose checksum is sum), in one transaction: all files or none. It returns true
// when it applied them. The rules, for a rolling upgrade between adjacent revisions:
//   - the database records an older revision, or none: apply, and record this one;
//   - it records this revision with the same checksum: nothing to do;
//   - it records this revision with another checksum: ErrSQLRevisionConflict;
//   - it records a newer revision: leave it (a newer instance applied it, and its revision
//     keeps what this one calls).
func applySQL(ctx context.Context, d *DB, revisions []string, sum string, log *slog.Logger) (bool, error) {
	mine := len(revisions) - 1
	names, bodies, err := sqlFiles(d.Dialect)
	if err != nil {
		return false, err
	}
	decide := func(stored int, storedSum string, found bool) (bool, error) {
		switch {
		case !found || stored < mine:
			return true, nil
		case stored > mine:
			if log != nil {
				log.Info("functions and triggers are newer than this build: left as they are",
					"revision", stored, "this_build", mine)
			}
			return false, nil
		case storedSum != sum:
			return false, fmt.Errorf("%w (revision %d: recorded %s, this build %s)", ErrSQLRevisionConflict, mine, storedSum, sum)
		}
		return false, nil
	}
	if d.Dialect == Postgres {
		return applySQLPostgres(ctx, d, names, bodies, mine, sum, decide)
	}
	var applied bool
	err = d.Write(ctx, func(db *gorm.DB) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			var row struct {
				Revision int
				Checksum string
			}
			res := tx.Raw("SELECT revision, checksum FROM idemgate_sql WHERE one = 1").Scan(&row)
			if res.Error != nil {
				return res.Error
			}
			var err error
			if applied, err = decide(row.Revision, row.Checksum, res.RowsAffected > 0); err != nil || !applied {
				return err
			}
			for _, n := range names {
				if err := tx.Exec(bodies[n]).Error; err != nil {
					return fmt.Errorf("models/sql/sqlite/%s: %w", n, err)
				}
			}
			return tx.Exec(`INSERT INTO idemgate_sql (one, revision, checksum, applied_at) VALUES (1, ?, ?, datetime('now'))
			  ON CONFLICT (one) DO UPDATE SET revision = excluded.revision, checksum = excluded.checksum,
			  applied_at = excluded.applied_at`, mine, sum).Error
		})
	})
	return applied, err
}

// applySQLPostgres is applySQL on PostgreSQL. The files run by the simple protocol (pgx uses
// it for a statement without arguments), which takes several statements in one string, and
// under a transaction-scoped advisory lock, which holds behind a transaction-mode pooler.
func applySQLPostgres(ctx context.Context, d *DB, names []string, bodies map[string]string, mine int, sum string,
	decide func(int, string, bool) (bool, error)) (bool, error) {
	var applied bool
	err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", sqlLockID); err != nil {
			return fmt.Errorf("take the functions' lock: %w", err)
		}
		var stored int
		var storedSum string
		found := true
		err := tx.QueryRow(ctx, "SELECT revision, checksum FROM idemgate_sql").Scan(&stored, &storedSum)
		if errors.Is(err, pgx.ErrNoRows) {
			found, err = false, nil
		}
		if err != nil {
			return err
		}
		if applied, err = decide(stored, storedSum, found); err != nil || !applied {
			return err
		}
		for _, n := range names {
			if _, err := tx.Exec(ctx, bodies[n]); err != nil {
				return fmt.Errorf("models/sql/postgres/%s: %w", n, err)
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO idemgate_sql (revision, checksum) VALUES ($1, $2)
		  ON CONFLICT (one) DO UPDATE SET revision = excluded.revision, checksum = excluded.checksum, applied_at = now()`,
			mine, sum)
		return err
	})
	return applied, err
}
