package awsfront

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strings"
)

// digestBody checks a body against the hex SHA-256 its x-amz-content-sha256
// header carries. moto signs over the header's value and never hashes the
// body (botocore's canonical request takes X-Amz-Content-SHA256 as given),
// so a body changed after signing would land there; on S3 it is refused
// (XAmzContentSHA256Mismatch). The front hashes while streaming and holds
// back the body's last bytes until the digest matches: a body that fails
// never reaches moto whole.
type digestBody struct {
	br   *bufio.Reader
	want string
	h    hash.Hash
	n    int64
	progress
}

// isHexDigest reports a literal payload digest: 64 hex digits.
func isHexDigest(v string) bool {
	if len(v) != 64 {
		return false
	}
	_, err := hex.DecodeString(v)
	return err == nil
}

func newDigestBody(body io.Reader, hexDigest string) *digestBody {
	return &digestBody{br: bufio.NewReaderSize(body, 64<<10), want: strings.ToLower(hexDigest), h: sha256.New()}
}

func (d *digestBody) Read(p []byte) (int, error) {
	if err := d.Err(); err != nil {
		return 0, err
	}
	n, err := d.br.Read(p)
	d.h.Write(p[:n])
	d.n += int64(n)
	if err == nil {
		// Look one byte ahead: if the body ends here, these are its last
		// bytes and must not be handed on before the digest is checked.
		if _, perr := d.br.Peek(1); perr != nil {
			err = perr
		}
	}
	if err == io.EOF {
		if got := hex.EncodeToString(d.h.Sum(nil)); got != d.want {
			return 0, d.fail(fmt.Errorf("awsfront: body of %d bytes: %w", d.n, ErrContentSHA256))
		}
		d.decoded.Store(d.n)
		return n, io.EOF
	}
	if err != nil {
		return 0, d.fail(fmt.Errorf("awsfront: reading the body: %w", err))
	}
	d.decoded.Store(d.n)
	return n, nil
}
