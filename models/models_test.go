package models_test

import (
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
		&models.Operation{}, &models.Attempt{}, &models.Event{}}
	for _, db := range dbs.All() {
		t.Run(string(db.Dialect), func(t *testing.T) {
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
}

// TestPreviousReleaseAcquireStillWorks: migration 00003 adds an overload of idemgate_acquire
// and keeps the previous release's 11-argument function, so an instance not yet upgraded in a
// rolling upgrade keeps admitting instead of failing every acquire of a held key.
func TestPreviousReleaseAcquireStillWorks(t *testing.T) {
	tenant := modeltest.Tenant(t, dbs.Postgres)
	var result string
	err := dbs.Postgres.Raw(`SELECT result FROM idemgate_acquire($1::bigint, 'k-old', 60, NULL, NULL, NULL, NULL,
		NULL, 'old-release', gen_random_uuid(), 'hash')`, tenant).Scan(&result).Error
	require.NoError(t, err)
	require.Equal(t, "admitted", result)
}
