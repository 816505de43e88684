package services

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
)

var dbs *modeltest.Set

func TestMain(m *testing.M) { os.Exit(modeltest.Run(m, &dbs)) }

// testBundle is what most tests need: services over one database and a fresh tenant.
type testBundle struct {
	db     *models.DB
	adm    *Admission
	reads  *Reads
	recon  *Reconciliation
	dash   *Dashboard
	audit  *Audit
	reaper *Reaper
	auth   *Auth
	// accounts is wired to auth, as services.New wires them: a revocation through it is
	// refused by auth at once.
	accounts *Accounts
	p        Principal
}

// eachDB runs fn as a subtest on PostgreSQL and on SQLite, each with a fresh tenant.
func eachDB(t *testing.T, fn func(t *testing.T, b *testBundle)) {
	t.Helper()
	onDBs(t, dbs.All(), fn)
}

// elapse lets d pass for b's tenant, for keys or (none named) all its keys, without waiting:
// its holds, TTLs and leases end d sooner (modeltest.Elapse). A hold acquired with a TTL of
// 1 s has expired after b.elapse(t, time.Second).
func (b *testBundle) elapse(t testing.TB, d time.Duration, keys ...string) {
	t.Helper()
	modeltest.Elapse(t, b.db, b.p.TenantID, d, keys...)
}

// onPostgres runs fn as a subtest on PostgreSQL only, for behaviour SQLite has no counterpart
// of (row locks, group admission). It fails if the set has no PostgreSQL database.
func onPostgres(t *testing.T, fn func(t *testing.T, b *testBundle)) {
	t.Helper()
	var pg []*models.DB
	for _, db := range dbs.All() {
		if db.Dialect == models.Postgres {
			pg = append(pg, db)
		}
	}
	if len(pg) == 0 {
		t.Fatal("no PostgreSQL database in the test set")
	}
	onDBs(t, pg, fn)
}

func onDBs(t *testing.T, set []*models.DB, fn func(t *testing.T, b *testBundle)) {
	t.Helper()
	modeltest.Each(t, set, func(t *testing.T, db *models.DB) {
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		auth := NewAuth(db, log)
		b := &testBundle{
			db: db, adm: NewAdmission(db, log, 0), reads: NewReads(db), recon: NewReconciliation(db),
			dash: NewDashboard(db), audit: NewAudit(db), reaper: NewReaper(db, log, 0), auth: auth,
			accounts: NewAccounts(db, log, auth), p: Principal{TenantID: modeltest.Tenant(t, db), Prefix: "idg_testtest"},
		}
		fn(t, b)
	})
}

// isCode reports whether err is a domain error with code.
func isCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// tenantName is the name of b's tenant.
func (b *testBundle) tenantName(t testing.TB) string {
	t.Helper()
	name, err := b.dash.TenantName(bg, b.p.TenantID)
	if err != nil {
		t.Fatalf("tenant name: %v", err)
	}
	return name
}
