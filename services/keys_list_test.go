package services

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestListKeysByStateAndPrefix: a state filter keeps the keys whose newest operation is in that
// state, never a key whose earlier generation is (the partial-index walk of keyFilterQuery
// joins only the generation holding the key's fencing token), and pages through them in the
// unfiltered list's order both ways. A prefix keeps exactly the keys that start with it,
// multi-byte characters included, over one tenant or all.
func TestListKeysByStateAndPrefix(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		keys := func(f KeyFilter) []string {
			t.Helper()
			page, err := b.reads.ListKeys(bg, b.p.TenantID, f)
			require.NoError(t, err)
			out := []string{}
			for _, v := range page.Items {
				out = append(out, v.Key)
			}
			return out
		}
		uncertain := func(key string) *Acquisition {
			acq := mustAcquire(t, b, key, 60)
			mustRecord(t, b, acq, OutcomeInput{Status: StateUncertain})
			return acq
		}
		mustAcquire(t, b, "kl:readmitted", 1) // its hold expires: generation 1 goes uncertain
		b.elapse(t, time.Second)
		again := mustAcquire(t, b, "kl:readmitted", 60) // generation 2, in progress
		require.EqualValues(t, 2, again.FencingToken)
		uncertain("kl:uncertain")
		rel := mustAcquire(t, b, "kl:released", 60)
		_, err := release(b, rel)
		require.NoError(t, err)
		done := mustAcquire(t, b, "kl:éa", 60)
		mustRecord(t, b, done, OutcomeInput{Status: StateSucceeded})
		mustAcquire(t, b, "kl:éz", 60)
		mustAcquire(t, b, "kl:f", 60)
		mustAcquire(t, b, "km:x", 60)

		require.Equal(t, []string{"kl:uncertain"}, keys(KeyFilter{State: StateUncertain}),
			"kl:readmitted's uncertain generation 1 is not its newest")
		require.Equal(t, []string{"kl:released"}, keys(KeyFilter{State: StateReleased}))
		require.Equal(t, []string{"kl:éa"}, keys(KeyFilter{State: StateSucceeded}))
		inProgress := []string{"km:x", "kl:f", "kl:éz", "kl:readmitted"} // newest first
		require.Equal(t, inProgress, keys(KeyFilter{State: StateInProgress}))

		// Page by page, one key a page, forwards and then back.
		var fwd []string
		var cursors []string
		f := KeyFilter{State: StateInProgress, Limit: 1}
		for {
			page, err := b.reads.ListKeys(bg, b.p.TenantID, f)
			require.NoError(t, err)
			require.Len(t, page.Items, 1)
			fwd = append(fwd, page.Items[0].Key)
			cursors = append(cursors, page.PrevCursor)
			if page.NextCursor == "" {
				break
			}
			f.Cursor = page.NextCursor
		}
		require.Equal(t, inProgress, fwd)
		page, err := b.reads.ListKeys(bg, b.p.TenantID, KeyFilter{State: StateInProgress, Limit: 2, Before: cursors[len(cursors)-1]})
		require.NoError(t, err)
		require.Len(t, page.Items, 2)
		require.Equal(t, inProgress[1:3], []string{page.Items[0].Key, page.Items[1].Key}, "the newer page, still newest first")

		require.Equal(t, []string{"kl:éz", "kl:éa"}, keys(KeyFilter{KeyPrefix: "kl:é"}))
		require.Equal(t, []string{"km:x", "kl:f", "kl:éz", "kl:éa", "kl:released", "kl:uncertain", "kl:readmitted"}, keys(KeyFilter{KeyPrefix: "k"}))
		require.Equal(t, []string{"kl:éz"}, keys(KeyFilter{KeyPrefix: "kl:é", State: StateInProgress}))
		require.Empty(t, keys(KeyFilter{KeyPrefix: "kl:\U0010FFFF"}))
		global, err := b.dash.ListKeysForOperator(bg, nil, KeyFilter{KeyPrefix: "kl:é"})
		require.NoError(t, err)
		var names []string
		for _, v := range global.Items {
			if v.TenantID == b.p.TenantID {
				names = append(names, v.Key)
			}
		}
		require.Equal(t, []string{"kl:éz", "kl:éa"}, names, "every tenant")
		other := otherTenant(t, b)
		page, err = b.reads.ListKeys(bg, other.TenantID, KeyFilter{KeyPrefix: "kl:"})
		require.NoError(t, err)
		require.Empty(t, page.Items, "another tenant's keys")
	})
}
