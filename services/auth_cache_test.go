package services

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// cacheEntry returns the cached entry of secret, and whether there is one.
func cacheEntry(a *Auth, secret string) (cachedKey, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.cache[hashSecret(secret)]
	return c, ok
}

// testClock is a clock for Auth.now that moves only when told, safe for the background
// refresh to read.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// A key in use is looked up again in the background once its entry is past refreshAfter, while
// requests go on using the entry: a revocation made on another instance is picked up by that
// refresh, and the key stops working without any request having missed the cache.
func TestAPIKeyCacheRefreshesInTheBackground(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		a := NewAuth(b.db, nil)
		clock := &testClock{t: time.Now()}
		a.now = clock.now
		base := clock.now()
		secret, err := NewAccounts(b.db, nil, a).CreateAPIKey(bg, Installation(), uniqueName("refresh-"), "", "")
		require.NoError(t, err)
		p, err := a.Authenticate(bg, secret)
		require.NoError(t, err)
		c, ok := cacheEntry(a, secret)
		require.True(t, ok)
		require.Equal(t, base, c.fetched, "an entry is as old as the start of its lookup")

		// Before refreshAfter: the entry answers, nothing else happens.
		clock.set(base.Add(refreshAfter - time.Millisecond))
		_, err = a.Authenticate(bg, secret)
		require.NoError(t, err)
		c, _ = cacheEntry(a, secret)
		require.False(t, c.refreshing)
		require.Equal(t, base, c.fetched)

		// Past refreshAfter, within CacheTTL: the entry answers and a refresh starts, which
		// replaces the entry with one as old as the refresh.
		refreshed := base.Add(refreshAfter)
		clock.set(refreshed)
		got, err := a.Authenticate(bg, secret)
		require.NoError(t, err)
		require.Equal(t, p, got)
		require.Eventually(t, func() bool {
			c, ok := cacheEntry(a, secret)
			return ok && c.fetched.Equal(refreshed) && !c.refreshing
		}, 5*time.Second, 5*time.Millisecond, "the refresh stores a newer entry")

		// Revoked elsewhere: the entry still answers within its bound, and its refresh drops
		// it, after which the key is refused.
		_, err = NewAccounts(b.db, nil, nil).RevokeAPIKey(bg, Installation(), APIKeyRef{Key: secret})
		require.NoError(t, err)
		clock.set(refreshed.Add(CacheTTL - time.Millisecond))
		_, err = a.Authenticate(bg, secret)
		require.NoError(t, err, "an entry within CacheTTL still answers")
		require.Eventually(t, func() bool {
			_, ok := cacheEntry(a, secret)
			return !ok
		}, 5*time.Second, 5*time.Millisecond, "the refresh drops a revoked key")
		_, err = a.Authenticate(bg, secret)
		require.ErrorIs(t, err, ErrUnauthorized)
	})
}

// An entry CacheTTL old is never used, and a failed refresh is not retried by every request:
// the entry lapses at its time and the next request asks the database itself.
func TestAPIKeyCacheEntryLapses(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		a := NewAuth(b.db, nil)
		clock := &testClock{t: time.Now()}
		a.now = clock.now
		base := clock.now()
		secret, err := NewAccounts(b.db, nil, a).CreateAPIKey(bg, Installation(), uniqueName("lapse-"), "", "")
		require.NoError(t, err)
		_, err = a.Authenticate(bg, secret)
		require.NoError(t, err)
		_, err = NewAccounts(b.db, nil, nil).RevokeAPIKey(bg, Installation(), APIKeyRef{Key: secret})
		require.NoError(t, err)

		// As if a refresh had started and failed: the entry keeps answering until it lapses.
		a.mu.Lock()
		c := a.cache[hashSecret(secret)]
		c.refreshing = true
		a.cache[hashSecret(secret)] = c
		a.mu.Unlock()
		clock.set(base.Add(CacheTTL - time.Millisecond))
		_, err = a.Authenticate(bg, secret)
		require.NoError(t, err)

		clock.set(base.Add(CacheTTL))
		_, err = a.Authenticate(bg, secret)
		require.ErrorIs(t, err, ErrUnauthorized)
	})
}

// Requests that find no usable entry while a lookup of the same key is in progress wait for
// that lookup and take its answer, rather than each asking the database.
func TestAPIKeyLookupsAreShared(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		a := NewAuth(b.db, nil)
		secret, err := NewAccounts(b.db, nil, a).CreateAPIKey(bg, Installation(), uniqueName("shared-"), "", "")
		require.NoError(t, err)
		h := hashSecret(secret)

		// A lookup in progress (made up: its answer is a principal the database does not have,
		// so a request that asked the database itself would get another).
		f := &keyFlight{started: time.Now(), done: make(chan struct{})}
		a.mu.Lock()
		a.flights[h] = f
		a.mu.Unlock()
		shared := Principal{TenantID: -7, TenantName: "shared", APIKeyID: -7, Prefix: "shared"}
		const n = 8
		var wg sync.WaitGroup
		got := make([]Principal, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], errs[i] = a.Authenticate(bg, secret)
			}()
		}
		f.p = shared
		close(f.done)
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i])
			require.Equal(t, shared, got[i], "request %d took the shared answer", i)
		}

		// A waiting request whose context ends stops waiting.
		f2 := &keyFlight{started: time.Now(), done: make(chan struct{})}
		a.mu.Lock()
		a.flights[h] = f2
		a.mu.Unlock()
		ctx, cancel := context.WithCancel(bg)
		cancel()
		_, err = a.Authenticate(ctx, secret)
		require.ErrorIs(t, err, context.Canceled)

		// A lookup that failed on its own request's context, or began CacheTTL ago or more,
		// is not taken: the waiting request asks the database itself.
		for _, stale := range []*keyFlight{
			{started: time.Now(), err: storeError("authenticate", context.DeadlineExceeded)},
			{started: time.Now().Add(-CacheTTL), p: shared},
		} {
			stale.done = make(chan struct{})
			close(stale.done)
			a.mu.Lock()
			a.flights[h] = stale
			a.mu.Unlock()
			go func() { // the leader hands over and leaves
				a.mu.Lock()
				delete(a.flights, h)
				a.mu.Unlock()
			}()
			p, err := a.Authenticate(bg, secret)
			require.NoError(t, err)
			require.Positive(t, p.TenantID, "looked up in the database")
		}
	})
}

// A lookup that read the key before this process revoked it does not put it back in the cache.
func TestAPIKeyRevokedHereIsNotCachedAgain(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		a := NewAuth(b.db, nil)
		secret, err := NewAccounts(b.db, nil, a).CreateAPIKey(bg, Installation(), uniqueName("gen-"), "", "")
		require.NoError(t, err)
		a.mu.Lock()
		gen := a.gen
		a.gen++ // what a revocation does (forget), between the lookup's read and its store
		a.mu.Unlock()
		_, err = a.lookup(bg, hashSecret(secret), time.Now(), gen)
		require.NoError(t, err)
		_, ok := cacheEntry(a, secret)
		require.False(t, ok, "an answer older than a revocation here is not cached")

		a.mu.Lock()
		gen = a.gen
		a.mu.Unlock()
		_, err = a.lookup(bg, hashSecret(secret), time.Now(), gen)
		require.NoError(t, err)
		_, ok = cacheEntry(a, secret)
		require.True(t, ok)
	})
}
