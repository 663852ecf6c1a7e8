package browser

import (
	"bytes"
	"fmt"
	"image/png"
)

// Thresholds of NonBlank. A page that rendered shows text (antialiased:
// dozens of shades) and boxes; a blank one, or one that rendered only its
// background, is one colour. Measured at 1280x800 on chromium 156: an
// unstyled sign-in form (a line of text, an input, a button) leaves 99.87%
// of the pixels white, an empty input alone 99.92%, a single letter
// 99.995%; so at least 0.1% of the pixels, about a line of text, must
// differ from the commonest colour.
const (
	minColours   = 8
	maxOneColour = 0.999
)

// NonBlank reports, as an error naming what it found, whether a PNG
// screenshot is blank: fewer than a few distinct colours, or one colour
// covering nearly all of it.
func NonBlank(data []byte) error {
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("screenshot: decoding the PNG: %w", err)
	}
	bounds := img.Bounds()
	total := bounds.Dx() * bounds.Dy()
	if total == 0 {
		return fmt.Errorf("screenshot: empty (%dx%d)", bounds.Dx(), bounds.Dy())
	}
	counts := map[[4]uint32]int{}
	var top [4]uint32
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, a := img.At(x, y).RGBA()
			c := [4]uint32{r >> 8, g >> 8, b >> 8, a >> 8}
			counts[c]++
			if counts[c] > counts[top] {
				top = c
			}
		}
	}
	share := float64(counts[top]) / float64(total)
	if len(counts) < minColours || share > maxOneColour {
		return fmt.Errorf("screenshot: blank: %d distinct colours, #%02x%02x%02x covers %.2f%% of %dx%d pixels (want at least %d colours, none over %.1f%%)",
			len(counts), top[0], top[1], top[2], share*100, bounds.Dx(), bounds.Dy(), minColours, maxOneColour*100)
	}
	return nil
}
