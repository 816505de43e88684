package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

func ptr[T any](v T) *T { return &v }

func TestAcquireFreeKeyThenDuplicateThenConflict(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		in := AcquireInput{Key: "order-1", TTLSeconds: 60, Operation: ptr("charge"), Fingerprint: ptr("fp1"),
			Metadata: json.RawMessage(`{"a": 1}`)}
		acq, err := b.adm.Acquire(ctx, b.p, in)
		require.NoError(t, err)
		require.True(t, acq.Admitted)
		require.EqualValues(t, 1, acq.FencingToken)
		require.Equal(t, models.StateInProgress, acq.State)
		require.NotEmpty(t, acq.OwnerToken)
		require.Nil(t, acq.PreviousOperation)
		require.WithinDuration(t, time.Now().Add(60*time.Second), acq.ExpiresAt, 5*time.Second)

		dup, err := b.adm.Acquire(ctx, b.p, in)
		require.NoError(t, err)
		require.False(t, dup.Admitted)
		require.Equal(t, acq.OperationID, dup.Operation.ID)
		require.EqualValues(t, 1, dup.Operation.DuplicateAttempts)
		require.JSONEq(t, `{"a":1}`, string(dup.Operation.Metadata))
		require.True(t, dup.Operation.Held)

		in.Fingerprint = ptr("fp2")
		_, err = b.adm.Acquire(ctx, b.p, in)
		require.ErrorIs(t, err, ErrFingerprintMismatch)
		in.Fingerprint = nil // absent equals only absent
		_, err = b.adm.Acquire(ctx, b.p, in)
		require.ErrorIs(t, err, ErrFingerprintMismatch)

		page, err := b.adm.ListAttempts(ctx, b.p.TenantID, AttemptFilter{Key: "order-1"})
		require.NoError(t, err)
		var results []string
		for _, a := range page.Items {
			results = append(results, a.Result)
		}
		require.Equal(t, []string{"conflict", "conflict", "duplicate", "admitted"}, results)
	})
}

func TestConcurrentAcquireAdmitsExactlyOne(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		const n = 40
		for round := 0; round < 3; round++ {
			key := fmt.Sprintf("race-%d", round)
			var wg sync.WaitGroup
			var mu sync.Mutex
			admitted, dups := 0, 0
			errs := []error{}
			start := make(chan struct{})
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					acq, err := b.adm.Acquire(context.Background(), b.p, AcquireInput{Key: key, TTLSeconds: 60})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil:
						errs = append(errs, err)
					case acq.Admitted:
						admitted++
					default:
						dups++
					}
				}()
			}
			close(start)
			wg.Wait()
			require.Empty(t, errs)
			require.Equal(t, 1, admitted)
			require.Equal(t, n-1, dups)
		}
	})
}

func TestExpiredHoldIsReadmittedWithNextFencingToken(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		first, err := b.adm.Acquire(ctx, b.p, AcquireInput{Key: "k", TTLSeconds: 1})
		require.NoError(t, err)
		time.Sleep(1100 * time.Millisecond)
		second, err := b.adm.Acquire(ctx, b.p, AcquireInput{Key: "k", TTLSeconds: 60})
		require.NoError(t, err)
		require.True(t, second.Admitted)
		require.EqualValues(t, 2, second.FencingToken)
		require.NotNil(t, second.PreviousOperation)
		require.Equal(t, first.OperationID, second.PreviousOperation.ID)
		require.Equal(t, models.StateUncertain, second.PreviousOperation.State)

		d, err := b.adm.GetOperation(ctx, b.p.TenantID, first.OperationID)
		require.NoError(t, err)
		require.Equal(t, models.StateUncertain, d.State)
		require.Equal(t, ReasonTTLExpired, *d.StateReason)
		require.False(t, d.Held)
		require.Len(t, d.Events, 1)

		// The late release by the first attempt changes nothing.
		_, err = b.adm.Release(ctx, b.p, ReleaseInput{Key: "k", OwnerToken: first.OwnerToken})
		require.ErrorIs(t, err, ErrNotOwner)
		k, err := b.adm.GetKey(ctx, b.p.TenantID, "k")
		require.NoError(t, err)
		require.True(t, k.Held)
		require.Equal(t, second.OperationID, k.Operation.ID)
		_ = errors.New
	})
}
