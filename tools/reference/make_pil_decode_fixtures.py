#!/usr/bin/env python3
"""Writes tests/fixtures/images/pil_decode/: small JPEG and PNG files of every
kind PIL decodes (CMYK/YCCK JPEGs with and without the Adobe marker, PNG at
every bit depth and colour type, tRNS, Adam7) plus the RGB8 pixels that
PIL's Image.open(f).convert("RGB") gives for each (.npy, H x W x 3 uint8), and
files PIL refuses (with PIL's message) so kiln's refusals can be checked.

Usage: python3 tools/reference/make_pil_decode_fixtures.py [--out DIR]
Needs: pillow, numpy; a C compiler and libjpeg headers (libjpeg62-turbo-dev)
for the YCCK files, which Pillow cannot write (tools/reference/write_cmyk_jpeg.c).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import PIL
from PIL import Image, features

SMALL = (17, 13)   # odd sizes: partial JPEG MCUs, PNG rows ending mid-byte
LARGE = (40, 31)
HERE = os.path.dirname(os.path.abspath(__file__))


def smooth_image(w, h, channels, seed):
    """Photo-like content (bicubic-upscaled noise) so JPEG errors stay realistic."""
    rng = np.random.default_rng(seed)
    planes = []
    for _ in range(channels):
        small = rng.integers(0, 256, (max(2, h // 4), max(2, w // 4)), dtype=np.uint8)
        planes.append(np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC)))
    return np.stack(planes, axis=-1)


# ------------------------------------------------------------------- PNG --

def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def pack_row(samples, bit_depth):
    """One row of samples (ints) to PNG bytes at the given bit depth."""
    if bit_depth == 16:
        return np.asarray(samples, dtype=">u2").tobytes()
    if bit_depth == 8:
        return np.asarray(samples, dtype=np.uint8).tobytes()
    per_byte = 8 // bit_depth
    padded = list(samples) + [0] * (-len(samples) % per_byte)
    out = bytearray()
    for i in range(0, len(padded), per_byte):
        b = 0
        for s in padded[i:i + per_byte]:
            b = (b << bit_depth) | int(s)
        out.append(b)
    return bytes(out)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def write_png(path, samples, color_type, bit_depth, interlace=False, plte=None, trns=None):
    """samples: H x W x C integer array (C = samples per pixel of the colour type)."""
    h, w = samples.shape[:2]

    def scanlines(a):
        return b"".join(b"\x00" + pack_row(a[y].reshape(-1), bit_depth) for y in range(a.shape[0]))

    if interlace:
        raw = b"".join(scanlines(samples[y0::dy, x0::dx]) for x0, y0, dx, dy in ADAM7
                       if samples[y0::dy, x0::dx].size)
    else:
        raw = scanlines(samples)
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0,
                                                                  1 if interlace else 0))
    if plte is not None:
        data += png_chunk(b"PLTE", bytes(np.asarray(plte, dtype=np.uint8).reshape(-1)))
    if trns is not None:
        data += png_chunk(b"tRNS", trns)
    data += png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(data)


def png_cases(d, add, sizes):
    rng = np.random.default_rng(11)
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
    type_names = {0: "gray", 2: "rgb", 3: "palette", 4: "graya", 6: "rgba"}

    def case(color_type, bit_depth, size, interlace=False, trns=None, plte_entries=None, suffix=""):
        w, h = size
        c = channels[color_type]
        top = (1 << bit_depth) - 1
        if color_type == 3:
            entries = plte_entries or (1 << bit_depth)
            plte = rng.integers(0, 256, (entries, 3))
            # Indices cover the whole bit range: with a short PLTE some point
            # past its end, which PIL and libpng must agree on.
            samples = rng.integers(0, 1 << bit_depth, (h, w, 1))
        else:
            plte = None
            base = smooth_image(w, h, c, int(rng.integers(1 << 30))).astype(np.int64)
            samples = (base * top) // 255 if bit_depth < 16 else base * 257 + rng.integers(0, 257, (h, w, c))
            samples = np.minimum(samples, top)
            if color_type == 0 and bit_depth == 16:
                samples = rng.integers(0, 600, (h, w, 1))  # PIL's I;16 -> RGB clamps above 255
        name = f"png_{type_names[color_type]}{bit_depth}_{w}x{h}{'_adam7' if interlace else ''}{suffix}.png"
        write_png(os.path.join(d, name), samples, color_type, bit_depth, interlace, plte, trns)
        add(name)

    for size in sizes:
        for bd in (1, 2, 4, 8, 16):
            case(0, bd, size)
        for bd in (1, 2, 4, 8):
            case(3, bd, size)
        for ct in (2, 4, 6):
            for bd in (8, 16):
                case(ct, bd, size)
    # Adam7 at every colour type and several depths, including images too
    # small to fill every pass.
    for size in (LARGE, SMALL, (3, 2), (1, 1)):
        for ct, bd in ((0, 1), (0, 2), (0, 16), (3, 4), (2, 8), (2, 16), (4, 16), (6, 8)):
            case(ct, bd, size, interlace=True)
    # Transparency chunks: dropped by convert("RGB").
    case(0, 8, SMALL, trns=struct.pack(">H", 77), suffix="_trns")
    case(0, 16, SMALL, trns=struct.pack(">H", 300), suffix="_trns")
    case(0, 2, SMALL, trns=struct.pack(">H", 1), suffix="_trns")
    case(2, 8, SMALL, trns=struct.pack(">HHH", 10, 20, 30), suffix="_trns")
    case(2, 16, SMALL, trns=struct.pack(">HHH", 1000, 2000, 3000), suffix="_trns")
    case(3, 8, LARGE, trns=bytes(range(0, 250, 3)), suffix="_trns")
    case(3, 4, SMALL, trns=bytes([0, 128, 255]), suffix="_trns")
    # PLTE shorter than the bit depth allows, indices past its end.
    case(3, 4, SMALL, plte_entries=5, suffix="_shortplte")
    case(3, 8, LARGE, plte_entries=100, suffix="_shortplte")


# ------------------------------------------------------------------ JPEG --

def build_cmyk_writer(tmp):
    exe = os.path.join(tmp, "write_cmyk_jpeg")
    subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "write_cmyk_jpeg.c"), "-ljpeg"], check=True)
    return exe


def strip_adobe_marker(data):
    """Removes APP14 'Adobe' segments: the same scan data without the marker."""
    out, i = bytearray(data[:2]), 2
    while i < len(data):
        marker = data[i + 1]
        if marker == 0xDA:  # start of scan: the rest is entropy-coded data
            out += data[i:]
            break
        length = struct.unpack(">H", data[i + 2:i + 4])[0]
        seg = data[i:i + 2 + length]
        if not (marker == 0xEE and seg[4:9] == b"Adobe"):
            out += seg
        i += 2 + length
    return bytes(out)


def jpeg_cases(d, add, tmp, sizes):
    exe = build_cmyk_writer(tmp)
    for w, h in sizes:
        rgb = Image.fromarray(smooth_image(w, h, 3, w * h))
        tag = f"{w}x{h}"
        for name, kw in ((f"jpeg_rgb420_{tag}.jpg", dict(quality=90)),
                         (f"jpeg_rgb444_{tag}.jpg", dict(quality=95, subsampling=0)),
                         (f"jpeg_rgb422_{tag}.jpg", dict(quality=85, subsampling=1)),
                         (f"jpeg_progressive_{tag}.jpg", dict(quality=90, progressive=True)),
                         (f"jpeg_restart_{tag}.jpg", dict(quality=90, restart_marker_blocks=1)),
                         # Adobe transform 0 with 3 components: stored as RGB, no YCbCr.
                         (f"jpeg_keep_rgb_{tag}.jpg", dict(quality=90, keep_rgb=True))):
            rgb.save(os.path.join(d, name), **kw)
            add(name)
        rgb.convert("L").save(os.path.join(d, f"jpeg_gray_{tag}.jpg"), quality=90)
        add(f"jpeg_gray_{tag}.jpg")
        rgb.convert("L").save(os.path.join(d, f"jpeg_gray_progressive_{tag}.jpg"), quality=90, progressive=True)
        add(f"jpeg_gray_progressive_{tag}.jpg")
        # Pillow writes CMYK inverted ("CMYK;I") with an Adobe marker, transform 0.
        cmyk = Image.fromarray(smooth_image(w, h, 4, w + h), "CMYK")
        cmyk.save(os.path.join(d, f"jpeg_cmyk_adobe_{tag}.jpg"), quality=90)
        add(f"jpeg_cmyk_adobe_{tag}.jpg")
        cmyk.save(os.path.join(d, f"jpeg_cmyk_progressive_{tag}.jpg"), quality=90, progressive=True)
        add(f"jpeg_cmyk_progressive_{tag}.jpg")
        with open(os.path.join(d, f"jpeg_cmyk_adobe_{tag}.jpg"), "rb") as f:
            bare = strip_adobe_marker(f.read())
        with open(os.path.join(d, f"jpeg_cmyk_noadobe_{tag}.jpg"), "wb") as f:
            f.write(bare)
        add(f"jpeg_cmyk_noadobe_{tag}.jpg")
        raw = os.path.join(tmp, "cmyk.raw")
        with open(raw, "wb") as f:
            f.write(smooth_image(w, h, 4, 3 * w + h).tobytes())
        for name, args in ((f"jpeg_ycck_{tag}.jpg", ["ycck"]),
                           (f"jpeg_ycck_progressive_{tag}.jpg", ["ycck", "progressive"]),
                           (f"jpeg_cmyk_libjpeg_{tag}.jpg", ["cmyk"]),
                           (f"jpeg_cmyk_libjpeg_noadobe_{tag}.jpg", ["cmyk", "noadobe"])):
            subprocess.run([exe, raw, str(w), str(h), os.path.join(d, name)] + args, check=True)
            add(name)


def adobe_transform(path):
    """The APP14 transform byte, or None: recorded so the manifest says what each file is."""
    data = open(path, "rb").read()
    i = data.find(b"\xff\xee")
    while i >= 0:
        if data[i + 4:i + 9] == b"Adobe":
            return data[i + 15]
        i = data.find(b"\xff\xee", i + 2)
    return None


# --------------------------------------------------------- refused files --

def refused_cases(d, entries, tag):
    """Files PIL refuses; the manifest keeps PIL's message for the docs."""
    def write(name, data):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        try:
            Image.open(os.path.join(d, name)).convert("RGB")
            raise SystemExit(f"{name}: PIL decoded it, not a refusal case")
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001 -- any PIL refusal
            entries.append({"file": name, "pil_error": f"{type(e).__name__}: {e}"})

    jpg = open(os.path.join(d, f"jpeg_cmyk_adobe_{tag}.jpg"), "rb").read()
    write("bad_cmyk_truncated.jpg", jpg[:len(jpg) * 2 // 3])
    ycck = open(os.path.join(d, f"jpeg_ycck_{tag}.jpg"), "rb").read()
    write("bad_ycck_truncated.jpg", ycck[:len(ycck) // 2])
    png = open(os.path.join(d, f"png_palette8_{tag}.png"), "rb").read()
    write("bad_truncated.png", png[:len(png) // 2])
    write("bad_text.jpg", b"this is plainly not an image\n")
    # IHDR declaring 20000 x 15000 = 3e8 > 2^28 pixels (PIL: decompression bomb).
    ihdr = struct.pack(">IIBBBBB", 20000, 15000, 8, 0, 0, 0, 0)
    write("bad_huge.png", b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) +
          png_chunk(b"IDAT", zlib.compress(b"\x00" * 100)) + png_chunk(b"IEND", b""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/images/pil_decode")
    ap.add_argument("--sizes", default="17x13,40x31",
                    help="WxH list for the per-size cases (larger sets for a one-off check: set "
                         "KILN_PIL_DECODE_DIR to the output folder when running kiln_tests)")
    args = ap.parse_args()
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    d = args.out
    os.makedirs(d, exist_ok=True)
    names = []
    with tempfile.TemporaryDirectory() as tmp:
        png_cases(d, names.append, sizes)
        jpeg_cases(d, names.append, tmp, sizes)
    decoded, refused = [], []
    for name in names:
        im = Image.open(os.path.join(d, name))
        ref = np.asarray(im.convert("RGB"), dtype=np.uint8)
        ref_name = name.rsplit(".", 1)[0] + ".npy"
        np.save(os.path.join(d, ref_name), np.ascontiguousarray(ref))
        e = {"file": name, "reference": ref_name, "pil_mode": im.mode}
        if name.endswith(".jpg"):
            e["adobe_transform"] = adobe_transform(os.path.join(d, name))
        decoded.append(e)
    refused_cases(d, refused, f"{sizes[-1][0]}x{sizes[-1][1]}")
    manifest = {
        "pillow": PIL.__version__,
        "pillow_libjpeg_turbo": features.version("libjpeg_turbo"),
        "pillow_zlib": features.version("zlib"),
        "python": sys.version.split()[0],
        "decoded": decoded,
        "refused": refused,
    }
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    total = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
    print(f"wrote {len(decoded)} decode cases and {len(refused)} refusals to {d} ({total / 1e3:.0f} kB); "
          f"Pillow {PIL.__version__}, libjpeg-turbo {manifest['pillow_libjpeg_turbo']}")


if __name__ == "__main__":
    main()
