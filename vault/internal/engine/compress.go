package engine

import (
	"bytes"
	"compress/flate"
	"fmt"
	"io"
	"sync"

	"github.com/keybrake/keybrake/vault"
)

// Stored answers are compressed before they are sealed, when they are long
// enough for it to pay: a Stripe object is JSON of a few kilobytes that
// deflate shrinks to about a third, and the answers of a day's requests are
// most of the file. A short answer (an error, a minimal object) is stored as
// it is: compressing it would cost more time than the bytes it saves.

// Codecs of a stored answer's body.
const (
	codecNone    byte = 0
	codecDeflate byte = 1
)

// compressMin is the shortest body compressed.
const compressMin = 1024

// maxInflated bounds a decompressed body: what the proxy ever stores is at
// most its response limit (16 MiB by default).
const maxInflated = 64 << 20

var deflaters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestSpeed) // a valid level: no error
	return w
}}

// compressBody returns body as it is stored, and its codec.
func compressBody(body []byte) ([]byte, byte) {
	if len(body) < compressMin {
		return body, codecNone
	}
	var buf bytes.Buffer
	buf.Grow(len(body) / 2)
	w := deflaters.Get().(*flate.Writer)
	defer deflaters.Put(w)
	w.Reset(&buf)
	if _, err := w.Write(body); err != nil {
		return body, codecNone
	}
	if err := w.Close(); err != nil || buf.Len() >= len(body) {
		return body, codecNone
	}
	return buf.Bytes(), codecDeflate
}

// decompressBody reverses compressBody.
func decompressBody(stored []byte, codec byte) ([]byte, error) {
	switch codec {
	case codecNone:
		return stored, nil
	case codecDeflate:
		r := flate.NewReader(bytes.NewReader(stored))
		defer r.Close()
		body, err := io.ReadAll(io.LimitReader(r, maxInflated+1))
		if err != nil || len(body) > maxInflated {
			return nil, fmt.Errorf("stored answer does not inflate: %w", vault.ErrStorage)
		}
		return body, nil
	}
	return nil, fmt.Errorf("stored answer in codec %d: %w", codec, vault.ErrStorage)
}
