package services

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

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
