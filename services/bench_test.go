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

// BenchmarkAcquire measures Acquire through the service layer on each dialect: "new" admits a
// fresh key per call, "duplicate" answers an already held key. Compare dialects and paths with
// each other in the same run (benchstat), never with a fixed number.
func BenchmarkAcquire(b *testing.B) {
	for _, db := range dbs.All() {
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		adm := NewAdmission(db, log, 0)
		p := Principal{TenantID: modeltest.Tenant(b, db), Prefix: "idg_bench"}
		ctx := context.Background()
		var n atomic.Int64
		b.Run(string(db.Dialect)+"/new", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := adm.Acquire(ctx, p, AcquireInput{Key: fmt.Sprintf("bench-%d", n.Add(1)), TTLSeconds: 3600}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		if _, err := adm.Acquire(ctx, p, AcquireInput{Key: "bench-dup", TTLSeconds: 3600}); err != nil {
			b.Fatal(err)
		}
		b.Run(string(db.Dialect)+"/duplicate", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					acq, err := adm.Acquire(ctx, p, AcquireInput{Key: "bench-dup", TTLSeconds: 3600})
					if err != nil || acq.Admitted {
						b.Errorf("want a duplicate, got %+v %v", acq, err)
						return
					}
				}
			})
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
