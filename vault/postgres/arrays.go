package postgres

import (
	"context"
	"encoding/binary"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// byteaArray is a bytea[] parameter (the keys and values of a batch's
// statements): byteaArrayCodec writes it into the statement's message as it
// is, in PostgreSQL's binary array format, with no allocation. pgx's own
// encoding of a [][]byte goes through reflection and boxes every element in
// an interface: an allocation per key and per value of every batch.
type byteaArray [][]byte

// byteaArrayCodec is pgx's codec of bytea[], but for a byteaArray, which it
// encodes itself. Everything else (another Go type, a scan) is pgx's.
type byteaArrayCodec struct{ pgtype.Codec }

// registerByteaArray gives conn's type map the bytea[] codec: the pool's
// AfterConnect, for every connection as it is made.
func registerByteaArray(_ context.Context, conn *pgx.Conn) error {
	m := conn.TypeMap()
	t, ok := m.TypeForOID(pgtype.ByteaArrayOID)
	if !ok {
		return nil // pgx's own map always has it; without it, pgx's encoding
	}
	m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: byteaArrayCodec{t.Codec}})
	return nil
}

func (c byteaArrayCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(byteaArray); ok && format == pgtype.BinaryFormatCode {
		return encodeByteaArray{}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

// encodeByteaArray writes a byteaArray as pgx writes a [][]byte, in the
// binary format of a one-dimensional array: the number of dimensions (1),
// whether an element is NULL, the elements' type; the dimension's length and
// lower bound (1); then each element's length (-1: NULL, for a nil []byte)
// and bytes.
type encodeByteaArray struct{}

func (encodeByteaArray) Encode(value any, buf []byte) ([]byte, error) {
	a := value.(byteaArray)
	if a == nil {
		return nil, nil // NULL, as pgx writes a nil slice
	}
	var hasNull uint32
	size := 20
	for _, e := range a {
		if e == nil {
			hasNull = 1
		}
		size += 4 + len(e)
	}
	buf = slices.Grow(buf, size) // at once, not by append's doublings
	buf = binary.BigEndian.AppendUint32(buf, 1)
	buf = binary.BigEndian.AppendUint32(buf, hasNull)
	buf = binary.BigEndian.AppendUint32(buf, pgtype.ByteaOID)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(a)))
	buf = binary.BigEndian.AppendUint32(buf, 1)
	for _, e := range a {
		if e == nil {
			buf = binary.BigEndian.AppendUint32(buf, math.MaxUint32) // -1
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(e)))
		buf = append(buf, e...)
	}
	return buf, nil
}
