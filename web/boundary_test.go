package web

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// modulePath is the import path prefix of this repository's packages.
const modulePath = "github.com/idemgate/idemgate"

// TestImportBoundary keeps the HTTP layer and the templates out of the storage layer: web/
// and views/ learn the domain only through services, so a change of tables or of the ORM
// stays inside models and services. It reads the import lists of the non-test Go files
// (views: the generated *_templ.go, which make check keeps in step with the .templ files):
//
//   - nothing under web/ imports models, gorm.io or a database driver (database/sql, pgx,
//     SQLite), except the test kits under web/internal/servertest, which builds a whole server
//     over a database as cli does: /readyz and the pool metrics ask services.Database;
//   - views/ imports no package of this repository but services and static, and nothing
//     from gorm.io;
//   - static/ imports no package of this repository, so that allowing it in views lets no
//     domain knowledge in: it is the embedded stylesheet, script and icon, and their URLs.
func TestImportBoundary(t *testing.T) {
	storage := func(path string) bool {
		return path == modulePath+"/models" || strings.HasPrefix(path, modulePath+"/models/") ||
			path == "gorm.io" || strings.HasPrefix(path, "gorm.io/") || path == "database/sql" ||
			strings.HasPrefix(path, "database/sql/") || strings.HasPrefix(path, "github.com/jackc/") ||
			strings.HasPrefix(path, "github.com/glebarez/") || strings.HasPrefix(path, "modernc.org/")
	}
	checks := []struct {
		dir    string
		skip   []string // directories (relative to the repository root) not checked
		refuse func(path string) bool
		why    string
	}{
		{dir: "web", skip: []string{"web/internal/servertest"}, refuse: storage,
			why: "web must reach the database through services"},
		{dir: "views", refuse: func(path string) bool {
			if storage(path) {
				return true
			}
			ours := path == modulePath || strings.HasPrefix(path, modulePath+"/")
			return ours && path != modulePath+"/services" && path != modulePath+"/static"
		}, why: "views may import only services (and static) of this repository"},
		{dir: "static", refuse: func(path string) bool {
			return path == modulePath || strings.HasPrefix(path, modulePath+"/")
		}, why: "static is a leaf package of assets"},
	}
	for _, c := range checks {
		files := 0
		err := filepath.WalkDir(filepath.Join("..", c.dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel("..", path)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				name := d.Name()
				if name == "testdata" || (rel != c.dir && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_"))) ||
					slices.Contains(c.skip, rel) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			files++
			for _, imp := range f.Imports {
				p, err := strconv.Unquote(imp.Path.Value)
				if err != nil {
					return err
				}
				if c.refuse(p) {
					t.Errorf("%s imports %s: %s", rel, p, c.why)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("reading %s: %v", c.dir, err)
		}
		if files == 0 {
			t.Fatalf("no Go files found under %s: the check would pass vacuously", c.dir)
		}
	}
}
