package playback

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/services"
)

// BenchmarkPlayback plays whole playbacks (eight steps, a tenant of its own each), and the
// Acquire sub-benchmark one acquire of a new key in the same sandbox, the baseline: a figure
// is reported as a ratio of the two, measured in the same run (docs/operations.md,
// Performance). Each playback uses its own account so the per-account bound never forgets one
// mid-run.
func BenchmarkPlayback(b *testing.B) {
	p := New(nil)
	defer p.Close()
	ctx := context.Background()
	// Open the sandbox outside the measurement.
	if _, err := p.Play(ctx, alice, uuid.NewString(), 1); err != nil {
		b.Fatal(err)
	}
	b.Run("Playback", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			viewer := &services.OperatorAccount{ID: int64(100 + i), Username: "bench", Role: services.RoleOperator}
			if _, err := p.Play(ctx, viewer, uuid.NewString(), Steps); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Acquire", func(b *testing.B) {
		sb := p.sandbox.sb
		pr, err := sb.newTenant(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; b.Loop(); i++ {
			if _, err := sb.svc.Admission.Acquire(ctx, pr, services.AcquireInput{Key: "k" + strconv.Itoa(i), TTLSeconds: 300}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkOpenSandbox is the first playback's extra cost: a new SQLite file, migrated.
func BenchmarkOpenSandbox(b *testing.B) {
	for b.Loop() {
		sb, err := openSandbox(context.Background(), slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		if err := sb.close(); err != nil {
			b.Fatal(err)
		}
	}
}
