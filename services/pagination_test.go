package services

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// walkBothWays pages forwards through a list (next) from the first page, then backwards
// (prev) from the last page to the first, and checks that going back shows exactly the pages
// seen going forwards, that the first page has no way back and the last none forward.
// next and prev take a cursor and return the page's ids and its next and previous cursors.
func walkBothWays(t *testing.T, want []string, limit int, next, prev func(cursor string) ([]string, string, string)) {
	t.Helper()
	var pages [][]string
	var all []string
	cursor := ""
	var lastPrev string
	for i := 0; ; i++ {
		require.Less(t, i, len(want)+2, "forward pagination does not end")
		ids, nc, pc := next(cursor)
		require.LessOrEqual(t, len(ids), limit)
		if i == 0 {
			require.Empty(t, pc, "the first page has no previous page")
		} else {
			require.NotEmpty(t, pc, "page %d has a way back", i)
		}
		pages = append(pages, ids)
		all = append(all, ids...)
		lastPrev = pc
		if nc == "" {
			break
		}
		cursor = nc
	}
	require.Equal(t, want, all, "forwards: every row once, in order")
	require.Greater(t, len(pages), 2, "the test needs at least three pages")
	// Backwards from the last page: each previous page is the one seen before it.
	cursor = lastPrev
	for i := len(pages) - 2; i >= 0; i-- {
		ids, nc, pc := prev(cursor)
		require.Equal(t, pages[i], ids, "backwards, page %d", i)
		require.NotEmpty(t, nc, "a page reached backwards leads forwards again")
		// Forwards again from a page reached backwards gives the page after it.
		again, _, _ := next(nc)
		require.Equal(t, pages[i+1], again, "forwards again from page %d", i)
		if i == 0 {
			require.Empty(t, pc, "back at the first page: no previous page")
		} else {
			require.NotEmpty(t, pc)
		}
		cursor = pc
	}
}

// TestKeysPageBackwards: KeyFilter.Before walks the keys list back, page by page, to the
// newest page, the same pages as forwards (docs/reference.md §5 "Newer").
func TestKeysPageBackwards(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		var want []string
		for i := 0; i < 8; i++ {
			k := fmt.Sprintf("back-%d", i)
			mustAcquire(t, b, k, 60)
			want = append([]string{k}, want...)
		}
		page := func(f KeyFilter) ([]string, string, string) {
			t.Helper()
			f.Limit = 3
			p, err := b.reads.ListKeys(bg, b.p.TenantID, f)
			require.NoError(t, err)
			var ids []string
			for _, it := range p.Items {
				ids = append(ids, it.Key)
			}
			return ids, p.NextCursor, p.PrevCursor
		}
		walkBothWays(t, want, 3,
			func(c string) ([]string, string, string) { return page(KeyFilter{Cursor: c}) },
			func(c string) ([]string, string, string) { return page(KeyFilter{Before: c}) })

		for name, f := range map[string]KeyFilter{
			"bad before": {Before: "!!"}, "both": {Before: encodeCursor(time.Now(), 1), Cursor: encodeCursor(time.Now(), 1)},
		} {
			_, err := b.reads.ListKeys(bg, b.p.TenantID, f)
			require.ErrorIs(t, err, ErrInvalidRequest, name)
		}
	})
}

// TestQueuePageBackwards: OperationFilter.Back walks the reconciliation queue back to its
// first page, the same pages as forwards.
func TestQueuePageBackwards(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		var want []string
		for i := 0; i < 7; i++ {
			acq := mustAcquire(t, b, fmt.Sprintf("qback-%d", i), 60)
			mustRecord(t, b, acq, OutcomeInput{Status: StateUncertain})
			want = append(want, acq.OperationID)
		}
		page := func(f OperationFilter) ([]string, string, string) {
			t.Helper()
			f.Limit, f.State = 2, StateUncertain
			p, err := b.reads.ListOperations(bg, b.p.TenantID, f)
			require.NoError(t, err)
			var ids []string
			for _, it := range p.Items {
				ids = append(ids, it.ID)
			}
			return ids, p.NextCursor, p.PrevCursor
		}
		walkBothWays(t, want, 2,
			func(c string) ([]string, string, string) { return page(OperationFilter{Cursor: c}) },
			func(c string) ([]string, string, string) { return page(OperationFilter{Back: c}) })

		c := encodeQueueCursor(time.Now(), "0b4e7a52-5c1f-4d8e-9a0b-3f2c1d4e5f60")
		for name, f := range map[string]OperationFilter{"bad back": {Back: "!!"}, "both": {Back: c, Cursor: c}} {
			f.State = StateUncertain
			_, err := b.reads.ListOperations(bg, b.p.TenantID, f)
			require.ErrorIs(t, err, ErrInvalidRequest, name)
		}
	})
}
