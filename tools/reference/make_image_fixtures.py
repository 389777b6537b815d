#!/usr/bin/env python3
"""Generates tests/fixtures/images/: inputs plus reference outputs for kiln's
image decoding, PIL-exact resizing and timm eval pre-processing.

References are made with timm's own transform when timm + torch are
importable (the GPU machine), otherwise with an equivalent pure-PIL/numpy
re-implementation of timm 1.0's transforms_imagenet_eval; the manifest records
which one was used. Pre-processing references are stored as the uint8 H x W x 3
image right before ToTensor (what decides exactness); the float math of
ToTensor + Normalize is checked separately on an image holding all 256 values.

Usage:  python3 tools/reference/make_image_fixtures.py --out tests/fixtures/images
        [--force-fallback]   (ignore timm even if installed)
        [--resize-dir DIR --resize-cases N]  (extra random resize cases, not committed)
        [--detection-only]  (only tests/fixtures/images/detection: RT-DETR's squash resize)
Needs: pillow, numpy, scikit-image (sample images); optionally timm + torch.
"""
import argparse
import io
import json
import math
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _config(size, crop_pct, interpolation, crop_mode="center", mean=IMAGENET_MEAN, std=IMAGENET_STD) -> dict:
    return dict(size=size, crop_pct=crop_pct, interpolation=interpolation, mean=mean, std=std, crop_mode=crop_mode)


# name -> input_size (h, w), crop_pct, interpolation, mean, std, crop_mode
CONFIGS = {
    "bicubic095_224": _config((224, 224), 0.95, "bicubic"),  # like resnet50.a1_in1k
    "bilinear0875_224": _config((224, 224), 0.875, "bilinear"),  # torchvision-style resnet eval
    "bicubic100_288": _config((288, 288), 1.0, "bicubic"),  # full-image crop at a larger resolution
    # non-square target: timm resizes with ResizeKeepRatio (bilinear)
    "bicubic0875_96x128": _config((96, 128), 0.875, "bicubic", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    "squash_bicubic09_112": _config((112, 112), 0.9, "bicubic", crop_mode="squash"),
    "border_bilinear1_112": _config((112, 112), 1.0, "bilinear", crop_mode="border"),
    "nearest0875_64": _config((64, 64), 0.875, "nearest"),
}

PIL_FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


# --------------------------------------------------------------- timm path --

def load_timm():
    try:
        import timm  # noqa: F401
        import torch  # noqa: F401
        from timm.data.transforms_factory import transforms_imagenet_eval
        return transforms_imagenet_eval
    except Exception:
        return None


def timm_reference(tf_factory, img, cfg):
    import torch
    h, w = cfg["size"]
    tf = tf_factory(img_size=(h, w) if h != w else h, crop_pct=cfg["crop_pct"],
                    crop_mode=cfg["crop_mode"], interpolation=cfg["interpolation"],
                    mean=cfg["mean"], std=cfg["std"])
    steps = tf.transforms
    # Everything before ToTensor/Normalize works on PIL images.
    u8_img = img
    for t in steps[:-2]:
        u8_img = t(u8_img)
    u8 = np.asarray(u8_img, dtype=np.uint8)
    full = tf(img).numpy()
    # The float tensor must be exactly our float32 normalization of `u8`.
    ours = normalize(u8, cfg["mean"], cfg["std"])
    diff = np.abs(full - ours).max()
    if diff != 0:
        print(f"WARNING: timm tensor differs from float32 normalize(u8) by {diff}")
    return u8, steps


def timm_normalize_reference(tf_factory, cfg):
    h, w = cfg["size"]
    tf = tf_factory(img_size=(h, w) if h != w else h, crop_pct=cfg["crop_pct"],
                    crop_mode=cfg["crop_mode"], interpolation=cfg["interpolation"],
                    mean=cfg["mean"], std=cfg["std"])
    out = all_values_image()
    for t in tf.transforms[-2:]:
        out = t(out)
    return out.numpy().astype(np.float32)


# ------------------------------------------------------- pure-PIL fallback --
# Mirrors timm 1.0 transforms_imagenet_eval + torchvision's Resize/CenterCrop
# on PIL images, step by step.

def keep_ratio_size(img_w, img_h, target_h, target_w, longest):
    ratio_h = img_h / target_h
    ratio_w = img_w / target_w
    ratio = max(ratio_h, ratio_w) * longest + min(ratio_h, ratio_w) * (1. - longest)
    return [round(x * 1.0 / ratio) for x in (img_h, img_w)]  # (h, w)


def tv_resize(img, size_hw, interp):
    if list(size_hw) == [img.height, img.width]:
        return img
    return img.resize((size_hw[1], size_hw[0]), PIL_FILTERS[interp])


def tv_center_crop(img, crop_h, crop_w, fill=0):
    w, h = img.size
    if crop_w > w or crop_h > h:
        pad = [(crop_w - w) // 2 if crop_w > w else 0, (crop_h - h) // 2 if crop_h > h else 0,
               (crop_w - w + 1) // 2 if crop_w > w else 0, (crop_h - h + 1) // 2 if crop_h > h else 0]
        canvas = Image.new("RGB", (w + pad[0] + pad[2], h + pad[1] + pad[3]),
                           tuple(fill) if isinstance(fill, (list, tuple)) else (fill,) * 3)
        canvas.paste(img, (pad[0], pad[1]))
        img = canvas
        w, h = img.size
        if crop_w == w and crop_h == h:
            return img
    top = int(round((h - crop_h) / 2.0))
    left = int(round((w - crop_w) / 2.0))
    return img.crop((left, top, left + crop_w, top + crop_h))


def fallback_reference(img, cfg):
    h, w = cfg["size"]
    crop_pct = cfg["crop_pct"] or 0.875
    scale = (math.floor(h / crop_pct), math.floor(w / crop_pct))
    interp = cfg["interpolation"]
    fill = 0
    if cfg["crop_mode"] == "squash":
        img = tv_resize(img, scale, interp)
    elif cfg["crop_mode"] == "border":
        img = tv_resize(img, keep_ratio_size(img.width, img.height, scale[0], scale[1], 1.0), interp)
        fill = [round(255 * v) for v in cfg["mean"]]
    elif scale[0] == scale[1]:
        s = scale[0]
        short, long = (img.width, img.height) if img.width <= img.height else (img.height, img.width)
        new_short, new_long = s, int(s * long / short)
        new_w, new_h = (new_short, new_long) if img.width <= img.height else (new_long, new_short)
        img = tv_resize(img, (new_h, new_w), interp)
    else:
        # timm passes no interpolation to ResizeKeepRatio here: bilinear.
        img = tv_resize(img, keep_ratio_size(img.width, img.height, scale[0], scale[1], 0.0),
                        "bilinear")
    img = tv_center_crop(img, h, w, fill)
    return np.asarray(img, dtype=np.uint8)


def normalize(u8, mean, std):
    x = u8.astype(np.float32).transpose(2, 0, 1) / np.float32(255)
    m = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    return ((x - m) / s).astype(np.float32)


def all_values_image():
    v = np.arange(256, dtype=np.int64)
    return Image.fromarray(np.stack([v, 255 - v, (v * 7) % 256], axis=-1)[None].astype(np.uint8))


# ------------------------------------------------------------ input images --

def write_png_raw(path, arr, color_type, bit_depth, interlace=False, width=None):
    """Minimal PNG writer for what PIL cannot write (16-bit RGB, Adam7, 4-bit).
    `arr` holds packed rows for bit depths < 8 (then pass the pixel `width`)."""
    h, w = arr.shape[0], width or arr.shape[1]
    dt = ">u2" if bit_depth == 16 else "u1"

    def scanlines(a):
        return b"".join(b"\x00" + a[y].astype(dt).tobytes() for y in range(a.shape[0]))

    if interlace:
        passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                  (0, 1, 1, 2)]
        raw = b"".join(scanlines(arr[y0::dy, x0::dx]) for x0, y0, dx, dy in passes
                       if arr[y0::dy, x0::dx].size)
    else:
        raw = scanlines(arr)

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9))
                + chunk(b"IEND", b""))


def sample_images():
    import skimage.data as data
    ast = Image.fromarray(data.astronaut())
    images = {
        "astronaut": ast.resize((256, 256), Image.LANCZOS),
        "chelsea": Image.fromarray(data.chelsea()).resize((301, 200), Image.LANCZOS),
        "coffee": Image.fromarray(data.coffee()).resize((300, 200), Image.LANCZOS),
        "rocket": Image.fromarray(data.rocket()).resize((214, 143), Image.LANCZOS),
        "camera": Image.fromarray(data.camera()).resize((256, 256), Image.LANCZOS),  # mode L
        "portrait": ast.crop((131, 40, 131 + 167, 40 + 251)),       # odd-sized portrait
        "tiny": ast.crop((200, 180, 237, 203)),                     # 37x23: upscaled
        "strip": Image.fromarray(data.coffee()).crop((0, 150, 600, 190)).resize((300, 20)),
    }
    return images


# (image, format, config)
PREPROCESS_CASES = [
    ("astronaut", "png", "bicubic095_224"), ("astronaut", "jpg", "bilinear0875_224"),
    ("chelsea", "png", "bicubic100_288"), ("chelsea", "jpg", "bicubic095_224"),
    ("coffee", "png", "bilinear0875_224"), ("rocket", "jpg", "bicubic095_224"),
    ("camera", "png", "bicubic095_224"), ("camera", "jpg", "bicubic0875_96x128"),
    ("portrait", "png", "bicubic100_288"), ("portrait", "jpg", "bicubic0875_96x128"),
    ("tiny", "png", "bicubic095_224"), ("strip", "png", "squash_bicubic09_112"),
    ("portrait", "png", "border_bilinear1_112"), ("chelsea", "png", "nearest0875_64"),
    ("coffee", "jpg", "squash_bicubic09_112"), ("rocket", "png", "border_bilinear1_112"),
]


def make_decode_fixtures(out, entries):
    d = os.path.join(out, "decode")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(7)
    smooth = np.asarray(Image.fromarray(
        rng.integers(0, 256, (8, 10, 3), dtype=np.uint8)).resize((45, 31), Image.BICUBIC))
    rgb = Image.fromarray(smooth)
    files = {}
    rgb.save(os.path.join(d, "rgb8.png")); files["rgb8.png"] = None
    rgb.convert("L").save(os.path.join(d, "gray8.png")); files["gray8.png"] = None
    rgb.convert("P", palette=Image.ADAPTIVE, colors=40).save(os.path.join(d, "palette.png"))
    files["palette.png"] = None
    p = rgb.convert("P", palette=Image.ADAPTIVE, colors=16)
    p.info["transparency"] = 3
    p.save(os.path.join(d, "palette_trns.png"), transparency=3); files["palette_trns.png"] = None
    rgba = rgb.copy(); rgba.putalpha(Image.fromarray((smooth[..., 0] // 2).astype(np.uint8)))
    rgba.save(os.path.join(d, "rgba8.png")); files["rgba8.png"] = None
    la = rgb.convert("L"); la = Image.merge("LA", (la, Image.fromarray(smooth[..., 1])))
    la.save(os.path.join(d, "la8.png")); files["la8.png"] = None
    rgb.convert("1").save(os.path.join(d, "bilevel.png")); files["bilevel.png"] = None
    big = rng.integers(0, 65536, (31, 45, 3), dtype=np.uint16)
    write_png_raw(os.path.join(d, "rgb16.png"), big, 2, 16); files["rgb16.png"] = None
    g16 = rng.integers(0, 600, (31, 45), dtype=np.uint16)  # mostly above 255: PIL clamps
    write_png_raw(os.path.join(d, "gray16.png"), g16, 0, 16); files["gray16.png"] = None
    rgba16 = rng.integers(0, 65536, (31, 45, 4), dtype=np.uint16)
    write_png_raw(os.path.join(d, "rgba16.png"), rgba16, 6, 16); files["rgba16.png"] = None
    g4 = rng.integers(0, 16, (31, 45), dtype=np.uint8)
    padded = np.zeros((31, 46), dtype=np.uint8); padded[:, :45] = g4
    packed = (padded[:, 0::2] << 4) | padded[:, 1::2]
    write_png_raw(os.path.join(d, "gray4.png"), packed, 0, 4, width=45); files["gray4.png"] = None
    write_png_raw(os.path.join(d, "interlaced.png"), smooth, 2, 8, interlace=True)
    files["interlaced.png"] = None
    rgb.save(os.path.join(d, "q90_420.jpg"), quality=90); files["q90_420.jpg"] = None
    rgb.save(os.path.join(d, "q95_444.jpg"), quality=95, subsampling=0); files["q95_444.jpg"] = None
    rgb.save(os.path.join(d, "q85_422.jpg"), quality=85, subsampling=1); files["q85_422.jpg"] = None
    rgb.save(os.path.join(d, "progressive.jpg"), quality=90, progressive=True)
    files["progressive.jpg"] = None
    rgb.convert("L").save(os.path.join(d, "gray.jpg"), quality=90); files["gray.jpg"] = None
    rgb.convert("CMYK").save(os.path.join(d, "cmyk.jpg"), quality=90)
    files["cmyk.jpg"] = None  # decoded since issue 11 (more cases: make_pil_decode_fixtures.py)
    for name, err in files.items():
        e = {"file": "decode/" + name}
        if err:
            e["expect_error"] = err
        else:
            ref = np.asarray(Image.open(os.path.join(d, name)).convert("RGB"), dtype=np.uint8)
            np.save(os.path.join(d, name.replace(".", "_") + ".npy"), ref)
            e["reference"] = "decode/" + name.replace(".", "_") + ".npy"
        entries.append(e)


def random_resize_cases(n, seed, out_dir, prefix, entries):
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    for i in range(n):
        kind = i % 6
        w, h = (int(v) for v in rng.integers(1, 90, 2))
        if kind == 0:    # downscale both
            ow, oh = max(1, w // 3 + int(rng.integers(0, 3))), max(1, h // 2)
        elif kind == 1:  # upscale both
            ow, oh = w * 2 + int(rng.integers(0, 5)), h + int(rng.integers(1, 40))
        elif kind == 2:  # width unchanged
            ow, oh = w, int(rng.integers(1, 120))
        elif kind == 3:  # height unchanged
            ow, oh = int(rng.integers(1, 120)), h
        elif kind == 4:  # mixed
            ow, oh = int(rng.integers(1, 120)), int(rng.integers(1, 120))
        else:            # strong downscale from a larger image
            w, h = int(rng.integers(100, 170)), int(rng.integers(80, 130))
            ow, oh = int(rng.integers(5, 40)), int(rng.integers(5, 40))
        if rng.random() < 0.5:   # smooth content (realistic) or noise (worst case)
            src = np.asarray(Image.fromarray(rng.integers(0, 256, (max(2, h // 8), max(2, w // 8), 3),
                                                          dtype=np.uint8)).resize((w, h), Image.BICUBIC))
        else:
            src = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        interp = ["bicubic", "bilinear", "nearest"][i % 3 if i % 7 else 0]
        res = np.asarray(Image.fromarray(src).resize((ow, oh), PIL_FILTERS[interp]), dtype=np.uint8)
        base = f"{prefix}{i:03d}"
        np.save(os.path.join(out_dir, base + "_in.npy"), src)
        np.save(os.path.join(out_dir, base + "_out.npy"), res)
        entries.append({"input": base + "_in.npy", "reference": base + "_out.npy",
                        "width": ow, "height": oh, "interpolation": interp})



# ---------------------------------------------------- detection resizing --
# RTDetrImageProcessor: Resize((640, 640), BILINEAR) of the whole image (no crop, aspect not kept),
# then x 1/255. References are the 8-bit PIL outputs, stored as PNG (lossless, small); the
# 640 x 640 output of chelsea is also the source of two downscaling cases.
DETECTION_CASES = [
    ("images/chelsea.jpg", 640, 640), ("images/portrait.png", 640, 640), ("images/tiny.png", 640, 640),
    ("images/rocket.jpg", 640, 640), ("images/strip.png", 640, 640),
    ("detection/chelsea_jpg_640x640.png", 320, 320), ("detection/chelsea_jpg_640x640.png", 240, 320),
]


def make_detection_fixtures(out):
    d = os.path.join(out, "detection")
    os.makedirs(d, exist_ok=True)
    cases = []
    try:  # transformers' default (torchvision) processor, for the record only
        from transformers.models.rt_detr.image_processing_rt_detr import RTDetrImageProcessor
        tv = RTDetrImageProcessor()
    except Exception:
        tv = None
    for src, w, h in DETECTION_CASES:
        img = Image.open(os.path.join(out, src)).convert("RGB")
        res = img.resize((w, h), Image.BILINEAR)
        stem = os.path.splitext(src)[0].split("/")[-1] + "_" + os.path.splitext(src)[1][1:]
        if src.startswith("detection/"):
            stem = os.path.splitext(src)[0].split("/")[-1]
        ref = f"detection/{stem}_{w}x{h}.png" if not src.startswith("detection/") else f"detection/{stem}_to_{w}x{h}.png"
        res.save(os.path.join(out, ref), optimize=True)
        entry = {"image": src, "width": w, "height": h, "interpolation": "bilinear", "reference": ref,
                 "source_size": [img.width, img.height]}
        if tv is not None and (w, h) == (640, 640):
            px = tv(img, return_tensors="np")["pixel_values"][0]
            u8 = np.asarray(res, dtype=np.uint8).transpose(2, 0, 1)
            entry["torchvision_processor_max_abs_diff_x255"] = float(np.abs(px * 255 - u8).max())
        cases.append(entry)
    with open(os.path.join(d, "manifest.json"), "w") as f:
        import PIL
        json.dump({"pillow": PIL.__version__, "cases": cases,
                   "note": "torchvision_processor_max_abs_diff_x255: transformers' default RTDetrImageProcessor "
                           "(torchvision backend) against PIL, in 8-bit steps; not what kiln matches"}, f, indent=1)
    print(f"wrote {len(cases)} detection resize cases to {d}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/images")
    ap.add_argument("--force-fallback", action="store_true")
    ap.add_argument("--resize-dir", help="also write many random resize cases here (not committed)")
    ap.add_argument("--resize-cases", type=int, default=600)
    ap.add_argument("--detection-only", action="store_true",
                    help="only write the detection resize fixtures (needs the sample images already there)")
    args = ap.parse_args()
    if args.detection_only:
        make_detection_fixtures(args.out)
        return

    tf_factory = None if args.force_fallback else load_timm()
    if tf_factory is not None:
        import timm
        import torch
        import torchvision
        generator = f"timm {timm.__version__} (torch {torch.__version__}, torchvision {torchvision.__version__})"
    else:
        generator = "pil-fallback (pure PIL/numpy re-implementation of timm 1.0 transforms_imagenet_eval)"
    import PIL
    print("references generated with:", generator, "| Pillow", PIL.__version__)

    out = args.out
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    manifest = {"generator": generator, "pillow": PIL.__version__, "configs": {},
                "decode": [], "resize": [], "preprocess": [], "normalize": []}
    for name, cfg in CONFIGS.items():
        manifest["configs"][name] = {"height": cfg["size"][0], "width": cfg["size"][1],
                                     "crop_pct": cfg["crop_pct"], "interpolation": cfg["interpolation"],
                                     "mean": list(cfg["mean"]), "std": list(cfg["std"]),
                                     "crop_mode": cfg["crop_mode"]}

    make_decode_fixtures(out, manifest["decode"])

    resize_entries = []
    random_resize_cases(30, 1234, os.path.join(out, "resize"), "r", resize_entries)
    manifest["resize"] = [{**e, "input": "resize/" + e["input"], "reference": "resize/" + e["reference"]}
                          for e in resize_entries]
    if args.resize_dir:
        extra = []
        random_resize_cases(args.resize_cases, 99, args.resize_dir, "x", extra)
        with open(os.path.join(args.resize_dir, "manifest.json"), "w") as f:
            json.dump({"pillow": PIL.__version__, "resize": extra}, f, indent=1)
        print(f"wrote {len(extra)} extra resize cases to {args.resize_dir}")

    images = sample_images()
    written = set()
    for img_name, fmt, cfg_name in PREPROCESS_CASES:
        src = images[img_name]
        fname = f"images/{img_name}.{fmt}"
        if fname not in written:
            path = os.path.join(out, fname)
            if fmt == "png":
                src.save(path, optimize=True)
            else:
                src.save(path, quality=90)
            written.add(fname)
        # What timm's loader does: Image.open(path).convert('RGB').
        pil = Image.open(os.path.join(out, fname)).convert("RGB")
        cfg = CONFIGS[cfg_name]
        if tf_factory is not None:
            u8, _ = timm_reference(tf_factory, pil, cfg)
            fb = fallback_reference(pil, cfg)
            if not np.array_equal(u8, fb):
                print(f"NOTE: fallback differs from timm for {fname} {cfg_name}")
        else:
            u8 = fallback_reference(pil, cfg)
        ref = f"images/{img_name}_{fmt}_{cfg_name}.npy"
        np.save(os.path.join(out, ref), np.ascontiguousarray(u8))
        manifest["preprocess"].append({"image": fname, "config": cfg_name, "reference": ref,
                                       "source_size": [pil.width, pil.height]})

    os.makedirs(os.path.join(out, "norm"), exist_ok=True)
    img = all_values_image()
    np.save(os.path.join(out, "norm", "all_values.npy"), np.asarray(img, dtype=np.uint8))
    for cfg_name in ("bicubic095_224", "bicubic0875_96x128"):
        cfg = CONFIGS[cfg_name]
        if tf_factory is not None:
            t = timm_normalize_reference(tf_factory, cfg)
        else:
            t = normalize(np.asarray(img, dtype=np.uint8), cfg["mean"], cfg["std"])
        ref = f"norm/{cfg_name}.npy"
        np.save(os.path.join(out, ref), np.ascontiguousarray(t))
        manifest["normalize"].append({"input": "norm/all_values.npy", "config": cfg_name,
                                      "reference": ref})

    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    make_detection_fixtures(out)
    total = sum(os.path.getsize(os.path.join(r, n)) for r, _, fs in os.walk(out) for n in fs)
    print(f"wrote {out}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
