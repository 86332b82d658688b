/* Colours, the memory states' pixels, and frames as they arrive on the wire. A part of lab.js: kvlab.web.bundle
 * joins the parts, in order, into one script, so every name here is shared with the other parts. */

// ---------------------------------------------------------------- colours and patterns
// Okabe & Ito's colour-blind-safe palette, without black (it reads as nobody's) and yellow (too light to tell
// from free memory). Conversation k gets PALETTE[k % 6]. The memory states differ by texture as well as colour,
// so that they read in grey and for colour-blind readers:
//   token: solid · reserved, still empty: stripes in a dark shade of the colour over its pale tint ·
//   reserved, never to be used: the same, cross-hatched · rounded up by the allocator: dark grey cross-hatch on
//   light grey · free: plain light grey.
// The stripes' ink is at least 3:1 against free grey in luminance (tests/web/test_lab_hero.py reads it off a
// screenshot), so "reserved but empty" never passes for "free".
const PALETTE = [
  [0xE6, 0x9F, 0x00], [0x56, 0xB4, 0xE9], [0x00, 0x9E, 0x73],
  [0x00, 0x72, 0xB2], [0xD5, 0x5E, 0x00], [0xCC, 0x79, 0xA7],
];
const PALETTE_NAMES = ["orange", "sky blue", "green", "blue", "vermillion", "purple"];
const PALE = 0.3; // the tint under the stripes: the conversation's colour at 30% over white
const INK = 0.45; // the stripes: the colour at 45% of its brightness
const FREE_RGB = [0xE4, 0xE4, 0xE4];
const GAP_RGB = [0xFF, 0xFF, 0xFF];
const OVERHEAD_BG = [0xE4, 0xE4, 0xE4];
const OVERHEAD_LINE = [0x4A, 0x4A, 0x4A];
const NOBODY = -1; // colour index of memory no conversation holds (the paged pool's null block)

const TOKEN = 0, RESERVED = 1, INTERNAL = 2, OVERHEAD = 3, FREE = 4;

function pale(rgb, f) { return rgb.map(v => Math.round(255 - (255 - v) * f)); }
function shade(rgb, f) { return rgb.map(v => Math.round(v * f)); }
function hex(rgb) { return "#" + rgb.map(v => v.toString(16).padStart(2, "0")).join(""); }
// ImageData is RGBA bytes; read as little-endian 32-bit words they are ABGR.
function word(rgb) { return ((255 << 24) | (rgb[2] << 16) | (rgb[1] << 8) | rgb[0]) >>> 0; }

const SOLID32 = PALETTE.map(word);
const PALETTE_HEX = PALETTE.map(hex);
const PALE32 = PALETTE.map(c => word(pale(c, PALE)));
const INK32 = PALETTE.map(c => word(shade(c, INK)));
const FREE32 = word(FREE_RGB), GAP32 = word(GAP_RGB);
const OVER_BG32 = word(OVERHEAD_BG), OVER_LINE32 = word(OVERHEAD_LINE);
const BOUNDARY32 = word([0x22, 0x22, 0x22]);

// The colour of one pixel at canvas position (x, y), for a slot state and a conversation colour. Patterns are
// anchored to the canvas, so stripes run on across neighbouring squares. ``simple`` (the first figure) draws all
// of a conversation's empty room one way: "reserved, still empty".
function pixel(state, colour, x, y, simple) {
  if (simple && colour !== NOBODY && (state === INTERNAL || state === OVERHEAD)) state = RESERVED;
  switch (state) {
    case TOKEN: return SOLID32[colour];
    case RESERVED: return (x + y) % 4 < 2 ? INK32[colour] : PALE32[colour];
    case INTERNAL: return ((x + y) % 4 === 0 || (x - y + 4000) % 4 === 0) ? INK32[colour] : PALE32[colour];
    case OVERHEAD: return ((x + y) % 3 === 0 || (x - y + 3000) % 3 === 0)
      ? (colour === NOBODY ? OVER_LINE32 : INK32[colour]) : OVER_BG32;
    default: return FREE32;
  }
}

function colourOf(owner) { return owner >= 0 ? owner % PALETTE.length : NOBODY; }

// ---------------------------------------------------------------- frames on the wire (see kvlab/web/frames.py)
function base64Bytes(s) {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// Columns in wire order: owner i32, token u16, reserved u16, internal u16, overhead u16, shared u8.
function decodeBlocks(msg) {
  const buf = base64Bytes(msg.data).buffer;
  const m = msg.n;
  let off = 0, index = null;
  if (!msg.key) { index = new Uint32Array(buf, 0, m); off = 4 * m; }
  const owner = new Int32Array(buf, off, m); off += 4 * m;
  const token = new Uint16Array(buf, off, m); off += 2 * m;
  const reserved = new Uint16Array(buf, off, m); off += 2 * m;
  const internal = new Uint16Array(buf, off, m); off += 2 * m;
  const overhead = new Uint16Array(buf, off, m); off += 2 * m;
  const shared = new Uint8Array(buf, off, m);
  return { key: msg.key, index, owner, token, reserved, internal, overhead, shared };
}
