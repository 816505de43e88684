package services

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// TestSessionStore covers the session storage the dashboard's session middleware uses: a
// value round-trips and is replaced, an expired or missing one reads as nil without error,
// and Delete and Reset remove rows. Reset removes every session, so the test runs on its own
// databases.
func TestSessionStore(t *testing.T) {
	t.Parallel()
	adminIsolated(t, func(t *testing.T, _ *Auth, db *models.DB) {
		s := NewSessionStore(db).WithTimeout(30 * time.Second)
		require.NoError(t, s.Close(), "Close leaves the database to its owner")

		got, err := s.Get("missing")
		require.NoError(t, err)
		require.Nil(t, got)

		require.NoError(t, s.Set("a", []byte("one"), time.Hour))
		got, err = s.Get("a")
		require.NoError(t, err)
		require.Equal(t, []byte("one"), got)
		require.NoError(t, s.Set("a", []byte("two"), 0), "Set replaces, and 0 means no expiry")
		got, err = s.Get("a")
		require.NoError(t, err)
		require.Equal(t, []byte("two"), got)
		var row models.Session
		require.NoError(t, db.Where("id = ?", "a").Take(&row).Error)
		require.Nil(t, row.ExpiresAt)

		require.NoError(t, s.Set("short", []byte("x"), time.Millisecond))
		time.Sleep(20 * time.Millisecond)
		got, err = s.Get("short")
		require.NoError(t, err)
		require.Nil(t, got, "an expired session reads as none before the reaper deletes it")

		require.NoError(t, s.Delete("a"))
		require.NoError(t, s.Delete("a"), "deleting a missing key is not an error")
		got, err = s.Get("a")
		require.NoError(t, err)
		require.Nil(t, got)

		require.NoError(t, s.Set("b", []byte("b"), time.Hour))
		require.NoError(t, s.Reset())
		var n int64
		require.NoError(t, db.Model(&models.Session{}).Count(&n).Error)
		require.Zero(t, n, "Reset removes every session, expired ones too")
	})
}

// TestSessionStoreTimeout: WithTimeout ignores a non-positive deadline, which keeps the default.
func TestSessionStoreTimeout(t *testing.T) {
	s := NewSessionStore(nil)
	require.Equal(t, DefaultSessionStoreTimeout, s.timeout)
	require.Equal(t, DefaultSessionStoreTimeout, s.WithTimeout(0).timeout)
	require.Equal(t, time.Second, s.WithTimeout(time.Second).timeout)
}
