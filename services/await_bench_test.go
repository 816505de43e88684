package services

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
)

// BenchmarkWakeUp measures how long a waiter (GET /v1/operations/{id}?wait=, docs/reference.md
// §8) takes to learn of an outcome recorded through another instance's pool, on PostgreSQL:
// "listen" with the LISTEN connection (the default), "poll" with IDEMGATE_LISTEN=false, where
// waiters look every 100 ms (AwaiterConfig's default poll). Each iteration admits a key, starts
// one waiter on it, records succeeded through a second pool, and times from just before that
// outcome call to the waiter's return (so the outcome's own commit is in both figures). It
// reports the p50 and p99 of those times in milliseconds, and the ratio of the modes is the
// figure to read (docs/operations.md "High availability"); a 2 s benchtime gives the poll mode
// only a few dozen samples, so its p99 is nearly its maximum.
func BenchmarkWakeUp(b *testing.B) {
	db := dbs.Postgres
	other, err := models.Open(context.Background(), models.OpenOptions{DatabaseURL: dbs.PostgresURL, MaxConns: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer other.Close()
	adm, remote := NewAdmission(db, nil, 0), NewAdmission(other, nil, 0)
	p := Principal{TenantID: modeltest.Tenant(b, db), Prefix: "idg_bench"}
	var seq atomic.Int64 // a fresh key per iteration, across the runs of -count and of b.N
	seq.Store(time.Now().UnixNano())
	for _, mode := range []struct {
		name string
		cfg  AwaiterConfig
	}{{"listen", AwaiterConfig{}}, {"poll", AwaiterConfig{NoListen: true}}} {
		b.Run(mode.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			aw := NewAwaiter(db, mode.cfg)
			done := make(chan struct{})
			go func() { defer close(done); aw.Run(ctx) }()
			defer func() { cancel(); <-done }()
			for !mode.cfg.NoListen && !aw.Listening() {
				time.Sleep(time.Millisecond)
			}
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				acq, err := adm.Acquire(ctx, p, AcquireInput{Key: fmt.Sprintf("wake/%s/%d", mode.name, seq.Add(1)), TTLSeconds: 600})
				if err != nil {
					b.Fatal(err)
				}
				if !acq.Admitted {
					b.Fatalf("key %s was not admitted", acq.Key)
				}
				woke := make(chan time.Time, 1)
				go func() {
					_, err := aw.Wait(ctx, p.TenantID, acq.OperationID, 30*time.Second)
					if err != nil {
						b.Error(err)
					}
					woke <- time.Now()
				}()
				for aw.Waiting() == 0 { // the waiter is in place before the outcome
					if len(woke) > 0 {
						b.Fatal("the wait ended before any outcome")
					}
					time.Sleep(50 * time.Microsecond)
				}
				start := time.Now()
				if _, err := remote.RecordOutcome(ctx, p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateSucceeded}); err != nil {
					b.Fatal(err)
				}
				took = append(took, (<-woke).Sub(start))
			}
			b.StopTimer()
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			at := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))]) / float64(time.Millisecond) }
			b.ReportMetric(at(0.50), "p50-ms")
			b.ReportMetric(at(0.99), "p99-ms")
		})
	}
}
