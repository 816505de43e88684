package services

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
)

// BenchmarkAcquire measures Acquire through the service layer on each dialect, 16 concurrent
// callers per CPU: "new" admits a fresh key per call (on PostgreSQL also "new-grouped", with
// group admission), "hot" answers duplicates of one held key (a retry storm), and
// "batch100" admits 100 fresh keys per AcquireBatch call; "readmit" releases and re-acquires
// a key per caller (each admission a later generation, acquire + release per op). Each reports acquires/s; compare
// modes and dialects with each other in the same run, never with a fixed number.
func BenchmarkAcquire(b *testing.B) {
	for _, db := range dbs.All() {
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		adm := NewAdmission(db, log, 0)
		p := Principal{TenantID: modeltest.Tenant(b, db), Prefix: "idg_bench"}
		ctx := context.Background()
		var n atomic.Int64
		parallel := func(b *testing.B, each func() error) {
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := each(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "acquires/s")
		}
		newKey := func(adm *Admission) func() error {
			return func() error {
				_, err := adm.Acquire(ctx, p, AcquireInput{Key: fmt.Sprintf("bench-%d", n.Add(1)), TTLSeconds: 3600})
				return err
			}
		}
		b.Run(string(db.Dialect)+"/new", func(b *testing.B) { parallel(b, newKey(adm)) })
		b.Run(string(db.Dialect)+"/new-grouped", func(b *testing.B) { parallel(b, newKey(adm.WithGroupAdmission(true))) })
		if _, err := adm.Acquire(ctx, p, AcquireInput{Key: "bench-hot", TTLSeconds: 3600}); err != nil {
			b.Fatal(err)
		}
		hot := func(adm *Admission) func() error {
			return func() error {
				acq, err := adm.Acquire(ctx, p, AcquireInput{Key: "bench-hot", TTLSeconds: 3600})
				if err == nil && acq.Admitted {
					err = fmt.Errorf("want a duplicate, got %+v", acq)
				}
				return err
			}
		}
		b.Run(string(db.Dialect)+"/hot-grouped", func(b *testing.B) { parallel(b, hot(adm.WithGroupAdmission(true))) })
		b.Run(string(db.Dialect)+"/hot", func(b *testing.B) {
			parallel(b, func() error {
				acq, err := adm.Acquire(ctx, p, AcquireInput{Key: "bench-hot", TTLSeconds: 3600})
				if err == nil && acq.Admitted {
					err = fmt.Errorf("want a duplicate, got %+v", acq)
				}
				return err
			})
		})
		// readmit: each caller releases its own key and acquires it again, so every acquire
		// admits a later generation (fencing token > 1): the path on which the webhook outbox's
		// possible-duplicate trigger runs (models/sql/postgres/operations_webhook_admitted.sql), here with no endpoint subscribed.
		b.Run(string(db.Dialect)+"/readmit", func(b *testing.B) {
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprintf("bench-readmit-%d", n.Add(1))
				for pb.Next() {
					acq, err := adm.Acquire(ctx, p, AcquireInput{Key: key, TTLSeconds: 3600})
					if err == nil && !acq.Admitted {
						err = fmt.Errorf("want an admission, got %+v", acq)
					}
					if err == nil {
						_, err = adm.Release(ctx, p, ReleaseInput{Key: key, OwnerToken: acq.OwnerToken})
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "acquires/s")
		})
		b.Run(string(db.Dialect)+"/batch100", func(b *testing.B) {
			items := make([]AcquireInput, 100)
			for i := 0; i < b.N; i++ {
				for j := range items {
					items[j] = AcquireInput{Key: fmt.Sprintf("bench-%d", n.Add(1)), TTLSeconds: 3600}
				}
				if _, err := adm.AcquireBatch(ctx, p, items); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(items))/b.Elapsed().Seconds(), "acquires/s")
		})
	}
}

// BenchmarkAcquireSQLiteSynchronous prices SQLite's durable commit: new-key acquires with
// synchronous=FULL, as models.Open sets it, against the same on NORMAL, which in WAL mode may
// lose the last commits on power failure and so admit a key twice. Each runs on its own fresh
// file in the same run; compare the two as a ratio.
func BenchmarkAcquireSQLiteSynchronous(b *testing.B) {
	for _, mode := range []string{"FULL", "NORMAL"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			db, err := models.Open(ctx, models.OpenOptions{SQLitePath: filepath.Join(b.TempDir(), "sync.db")})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			if _, err := models.Migrate(ctx, db, nil); err != nil {
				b.Fatal(err)
			}
			sqlDB, err := db.SQL()
			if err != nil {
				b.Fatal(err)
			}
			// The pragma is per connection: hold every connection of the pool at once so each
			// gets it, then give them back to the idle pool, which keeps them all.
			var conns []*sql.Conn
			for i := 0; i < sqlDB.Stats().MaxOpenConnections; i++ {
				c, err := sqlDB.Conn(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := c.ExecContext(ctx, "PRAGMA synchronous="+mode); err != nil {
					b.Fatal(err)
				}
				conns = append(conns, c)
			}
			for _, c := range conns {
				_ = c.Close()
			}
			adm := NewAdmission(db, slog.New(slog.NewTextHandler(io.Discard, nil)), 0)
			p := Principal{TenantID: modeltest.Tenant(b, db), Prefix: "idg_bench"}
			var n atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := adm.Acquire(ctx, p, AcquireInput{Key: fmt.Sprintf("sync-%d", n.Add(1)), TTLSeconds: 3600}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
