package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/keybrake/keybrake/proxy/logfield"
)

// Secret names: environment variables, and the files in the data directory that
// hold the generated development defaults.
const (
	envMasterKey   = "KEYBRAKE_MASTER_KEY"
	envJWTSecret   = "KEYBRAKE_JWT_SECRET"
	envStripeKey   = "STRIPE_SECRET_KEY"
	envAdminToken  = "KEYBRAKE_ADMIN_TOKEN"
	masterKeyFile  = "master.key"
	jwtSecretFile  = "jwt.secret"
	databaseFile   = "keybrake.db"
	masterKeyBytes = 32
	// minJWTSecret is the shortest HS256 secret accepted: 256 bits.
	minJWTSecret = 32
)

// errNoSecret says a secret is neither in the environment nor in the data directory.
var errNoSecret = errors.New("no secret")

// secretSource says where a secret came from, for the log.
type secretSource string

const (
	sourceEnv       secretSource = "environment"
	sourceFile      secretSource = "data directory"
	sourceGenerated secretSource = "generated"
)

// howToMakeMasterKey ends every master key error: the commands that make one.
const howToMakeMasterKey = "make one with: openssl rand -base64 32 (or: head -c 32 /dev/urandom | base64)"

// decodeMasterKey decodes a base64 (standard or URL alphabet, padded or not)
// 32-byte master key. Its errors say what the key must be and how to make one; a
// key written in hex (64 hex digits, which is also valid base64 of 48 bytes) is
// recognised as such.
func decodeMasterKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if len(s) == 2*masterKeyBytes && isHex(s) {
		return nil, fmt.Errorf("the master key looks like hex; it must be base64 of 32 bytes: convert it with: echo %s | xxd -r -p | base64; or %s",
			"<hex>", howToMakeMasterKey)
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		b, err := enc.DecodeString(s)
		if err != nil {
			continue
		}
		if len(b) != masterKeyBytes {
			return nil, fmt.Errorf("the master key is base64 of %d bytes; it must be base64 of %d bytes: %s", len(b), masterKeyBytes, howToMakeMasterKey)
		}
		return b, nil
	}
	return nil, fmt.Errorf("the master key is not base64; it must be base64 of %d bytes: %s", masterKeyBytes, howToMakeMasterKey)
}

// isHex reports whether s is made of hexadecimal digits only.
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return s != ""
}

// checkJWTSecret refuses secrets too short for HS256.
func checkJWTSecret(b []byte) ([]byte, error) {
	if len(b) < minJWTSecret {
		return nil, fmt.Errorf("jwt secret is %d bytes, want at least %d", len(b), minJWTSecret)
	}
	return b, nil
}

// newMasterKeyText returns a fresh master key in its file/environment form.
func newMasterKeyText() (string, error) { return randomText(masterKeyBytes, base64.StdEncoding) }

// newJWTSecretText returns a fresh JWT secret: 32 random bytes as base64url text;
// the text itself is the secret.
func newJWTSecretText() (string, error) { return randomText(32, base64.RawURLEncoding) }

// randomText returns n random bytes encoded with enc.
func randomText(n int, enc *base64.Encoding) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate secret: %w", err)
	}
	return enc.EncodeToString(b), nil
}

// noEnv is a getenv with an empty environment: loadSecret then reads the file only.
func noEnv(string) string { return "" }

// secretSpec describes one secret that serve needs.
type secretSpec struct {
	env      string
	file     string
	generate func() (string, error)
	decode   func(string) ([]byte, error)
}

var (
	masterKeySpec = secretSpec{env: envMasterKey, file: masterKeyFile, generate: newMasterKeyText, decode: decodeMasterKey}
	jwtSecretSpec = secretSpec{
		env: envJWTSecret, file: jwtSecretFile, generate: newJWTSecretText,
		decode: func(s string) ([]byte, error) { return checkJWTSecret([]byte(strings.TrimSpace(s))) },
	}
)

// loadSecret returns the secret from the environment, else from its file in dir.
// It returns errNoSecret when neither has it.
func loadSecret(spec secretSpec, getenv func(string) string, dir string, logger *slog.Logger) ([]byte, secretSource, error) {
	if v := getenv(spec.env); v != "" {
		b, err := spec.decode(v)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", spec.env, err)
		}
		return b, sourceEnv, nil
	}
	path := filepath.Join(dir, spec.file)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("%s unset and %s missing: %w", spec.env, path, errNoSecret)
	}
	if err != nil {
		return nil, "", fmt.Errorf("read %s: %w", path, err)
	}
	b, err := spec.decode(string(data))
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 && logger != nil {
		logger.Warn("secret file is readable by other users; chmod 600 it", logfield.Path, path, "mode", fi.Mode().Perm().String())
	}
	return b, sourceFile, nil
}

// loadOrGenerateSecret is loadSecret that, when neither the environment nor the
// file has the secret, generates one into the file (mode 0600) and warns that this
// is a development default.
func loadOrGenerateSecret(spec secretSpec, getenv func(string) string, dir string, logger *slog.Logger) ([]byte, secretSource, error) {
	b, src, err := loadSecret(spec, getenv, dir, logger)
	if !errors.Is(err, errNoSecret) {
		return b, src, err
	}
	text, err := spec.generate()
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, spec.file)
	created, err := writeFileExclusive(path, []byte(text+"\n"))
	if err != nil {
		return nil, "", fmt.Errorf("write %s: %w", path, err)
	}
	if !created {
		// Another process generated it first: use theirs.
		return loadSecret(spec, noEnv, dir, logger)
	}
	b, err = spec.decode(text)
	if err != nil {
		return nil, "", fmt.Errorf("decode generated %s: %w", spec.file, err)
	}
	logger.Warn("generated a development secret; set the environment variable in production",
		"variable", spec.env, logfield.Path, path)
	return b, sourceGenerated, nil
}

// writeFileExclusive writes data to path with mode 0600 unless path exists
// (created false). The file appears complete or not at all: the data is written
// and synced under a temporary name, then hard-linked into place (which fails
// when path exists), and the directory is synced.
func writeFileExclusive(path string, data []byte) (created bool, err error) {
	tmpName, _, err := writeTemp(path, func(w io.Writer) (int64, error) {
		n, err := w.Write(data)
		return int64(n), err
	})
	if err != nil {
		return false, err
	}
	defer os.Remove(tmpName)
	if err := os.Link(tmpName, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("link into place: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return false, err
	}
	return true, nil
}

// writeTemp writes a temporary file beside path through fill, syncs and closes it,
// and returns its name for the caller to move into place. os.CreateTemp makes it
// mode 0600, so a secret or a copy of the database is never readable by others,
// not even for a moment. On error nothing is left behind.
func writeTemp(path string, fill func(io.Writer) (int64, error)) (tmpName string, n int64, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", 0, fmt.Errorf("create temporary file: %w", err)
	}
	if n, err = fill(tmp); err != nil {
		err = fmt.Errorf("write temporary file: %w", err)
	} else if err = tmp.Sync(); err != nil {
		err = fmt.Errorf("sync temporary file: %w", err)
	}
	if cerr := tmp.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close temporary file: %w", cerr)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return "", 0, err
	}
	return tmp.Name(), n, nil
}

// syncDir fsyncs a directory so a rename or link in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
