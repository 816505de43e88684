package models_test

import (
	"context"
	"database/sql"
	"os"
	"sync"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm/schema"
)

var dbs *modeltest.Set

func TestMain(m *testing.M) { os.Exit(modeltest.Run(m, &dbs)) }

// TestModelsMatchMigrations checks that every field of every model has a column in the migrated
// schema of both dialects, so a model and its SQL migration cannot drift apart silently.
func TestModelsMatchMigrations(t *testing.T) {
	all := []any{&models.Tenant{}, &models.APIKey{}, &models.Operator{}, &models.Session{}, &models.IdemKey{},
		&models.Operation{}, &models.Attempt{}, &models.Event{}, &models.WebhookEndpoint{}, &models.WebhookEvent{},
		&models.ReconciliationJob{}, &models.ReconciliationJobItem{}}
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		for _, m := range all {
			var cache sync.Map
			s, err := schema.Parse(m, &cache, db.NamingStrategy)
			require.NoError(t, err)
			require.True(t, db.Migrator().HasTable(s.Table), s.Table)
			for _, f := range s.Fields {
				if f.DBName == "" {
					continue
				}
				require.True(t, db.Migrator().HasColumn(m, f.DBName), "%s.%s", s.Table, f.DBName)
			}
		}
	})
}

// TestSQLiteSynchronousFull checks that every connection of the SQLite pool commits with
// synchronous=FULL: in WAL mode NORMAL may lose the last committed transactions on power
// failure, and a lost admission lets the key be admitted twice. The pragma is per connection,
// so all the pool's connections are held at once and each is asked.
func TestSQLiteSynchronousFull(t *testing.T) {
	sqlDB, err := dbs.SQLite.SQL()
	require.NoError(t, err)
	ctx := context.Background()
	n := sqlDB.Stats().MaxOpenConnections
	require.Positive(t, n)
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := sqlDB.Conn(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	require.Equal(t, n, sqlDB.Stats().OpenConnections, "every connection of the pool is held")
	for i, c := range conns {
		var mode int
		require.NoError(t, c.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&mode))
		require.Equal(t, 2, mode, "connection %d: synchronous must be FULL (2)", i)
		var journal string
		require.NoError(t, c.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&journal))
		require.Equal(t, "wal", journal, "connection %d", i)
	}
}
