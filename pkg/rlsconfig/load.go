package rlsconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// LoadDir reads every .yaml and .yml file under dir (subdirectories
// included, in lexical order), as the reference reads its runtime
// directory (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config), and compiles them.
// A directory without any document compiles to a configuration without a
// domain, as the reference serves one (every descriptor answered OK); a
// directory that does not exist is an error.
func LoadDir(dir string, merge bool, opts ...Option) (*Config, error) {
	docs, err := ReadDir(dir)
	if err != nil {
		return nil, err
	}
	return Compile(docs, merge, opts...)
}

// Files lists the documents under dir as ReadDir reads them: every .yaml
// and .yml file, subdirectories included, hidden entries skipped, in
// lexical order. A directory without any has none (no error).
func Files(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// Hidden entries are editors' and Kubernetes' (..data symlinks).
		if path != dir && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(path); !d.IsDir() && (ext == ".yaml" || ext == ".yml") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading rate limit configuration: %w", err)
	}
	sort.Strings(files)
	return files, nil
}

// ReadDir parses every document under dir, reporting every problem of
// every file at once.
func ReadDir(dir string) ([]*Document, error) {
	files, err := Files(dir)
	if err != nil {
		return nil, err
	}
	var docs []*Document
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading rate limit configuration: %w", err))
			continue
		}
		d, err := Parse(f, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		docs = append(docs, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return docs, nil
}
