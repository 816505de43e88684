package main

import (
	"context"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// TestAbandonedTransactionFreesItsLocks: a transaction cut off by a stalled network (the client
// gives up at its deadline, but neither its next statement nor its close reaches PostgreSQL)
// must not keep its row locks until TCP keepalive notices, hours later: every other instance's
// acquires of that key and every reaper would wait on them. models.DB.Tx bounds the server
// side too (idle_in_transaction_session_timeout), so a direct connection gets the lock soon
// after the client's deadline, long before the stall ends.
func TestAbandonedTransactionFreesItsLocks(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	ctx := context.Background()
	direct, err := models.Open(ctx, models.OpenOptions{DatabaseURL: dbURL, MaxConns: 2})
	require.NoError(t, err)
	defer direct.Close()
	_, err = models.Migrate(ctx, direct, nil)
	require.NoError(t, err)
	tenant := modeltest.Tenant(t, direct)

	px := testkit.NewProxy(t, "")
	proxied := px.Via(t, dbURL)
	db, err := models.Open(ctx, models.OpenOptions{DatabaseURL: proxied, MaxConns: 2, StoreTimeout: time.Second})
	require.NoError(t, err)
	defer db.Close()

	resumed := time.AfterFunc(stallWindow, func() { px.SetStalled(false) })
	defer resumed.Stop()
	err = db.Tx(ctx, func(tx *gorm.DB) error {
		var id int64
		if err := tx.Raw("SELECT id FROM tenants WHERE id = ? FOR UPDATE", tenant).Scan(&id).Error; err != nil {
			return err
		}
		px.SetStalled(true) // from here nothing this client sends reaches the server
		return tx.Exec("UPDATE tenants SET name = name WHERE id = ?", tenant).Error
	})
	require.Error(t, err, "the statement sent into the stall cannot have been answered")

	t.Logf("the client gave up: %v", err)
	waitStart := time.Now()
	lockCtx, cancel := context.WithTimeout(ctx, stallWindow)
	defer cancel()
	var id int64
	require.NoError(t, direct.WithContext(lockCtx).Transaction(func(tx *gorm.DB) error {
		return tx.Raw("SELECT id FROM tenants WHERE id = ? FOR UPDATE", tenant).Scan(&id).Error
	}), "the abandoned transaction still held the row lock when the stall ended")
	require.True(t, resumed.Stop(), "the lock must be freed by the server's bound, not by the stall ending")
	t.Logf("a direct connection got the lock after %s", time.Since(waitStart).Round(time.Millisecond))
	require.Equal(t, tenant, id)
	px.SetStalled(false) // so closing the pool does not wait on the stalled connection
}
