"""ASR commands: `callqa models build|list|keygen|sign` and `callqa transcribe` (wired into pipeline/cli.py)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.asr.manifest import Manifest, model_versions
from pipeline.asr.results import TranscriptResult
from pipeline.asr.signing import (
    generate_key,
    key_id,
    load_private_key,
    public_key_text,
    sign_model,
    signer_id,
)
from pipeline.audio.files import AudioFileError
from pipeline.config import get_settings

if TYPE_CHECKING:
    from rich.progress import TaskID

    from pipeline.asr.batcher import SegmentBatcher
    from pipeline.segmentation import SpeechSegment

models_app = typer.Typer(
    no_args_is_help=True, help="Speech models (Whisper, Moonshine): build ONNX graphs from packaged weights, sign them."
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


@models_app.command("build")
def build(
    name: Annotated[str, typer.Argument(help="tiny.en, base, moonshine-tiny or moonshine-base (default: CALLQA_MODEL)")] = "",
    version: Annotated[int | None, typer.Option(help="Version number (default: next free).")] = None,
    if_needed: Annotated[bool, typer.Option(
        "--if-needed", help="Only build when no version of this graph format and revision exists (what make runs).",
    )] = False,
    key: Annotated[Path | None, typer.Option(
        help="Ed25519 private key (callqa models keygen): sign the version before it appears.",
    )] = None,
) -> None:
    """Build the ONNX graphs of a model into models_dir/<name>/<version>/: Whisper's fp32 and int8 from its
    CTranslate2 weights, Moonshine's from the packaged .ort graphs (weight casts folded, cross-attention mask)."""
    from pipeline.asr.build import build_model  # onnx is imported only when building
    from pipeline.asr.manifest import Manifest, ModelNotBuiltError, current_format, latest_model_folder

    models_dir = Path(get_settings().models_dir)
    name = name or get_settings().model
    if if_needed:
        try:
            folder = latest_model_folder(models_dir, name)
            built = Manifest.read(folder)
            if (built.graph_format, built.graph_revision) == current_format(built.family):
                console.print(f"{name}: version {folder.name} is built ({folder})")
                return
        except ModelNotBuiltError:
            pass
    sign_key = load_private_key(key) if key is not None else None  # a bad key fails before the build
    started = time.perf_counter()
    with console.status(f"building {name} from its packaged weights..."):
        result = build_model(name, models_dir, version, sign_key)
    m = result.manifest
    console.print(
        f"built {m.name} version {m.version} in {result.folder} "
        f"({time.perf_counter() - started:.1f} s, from {m.source_package} {m.source_version})"
    )


@models_app.command("keygen")
def keygen(
    key: Annotated[Path, typer.Option(help="Where to write the private key (PEM, mode 0600; never overwritten).")],
) -> None:
    """Make an Ed25519 key pair for signing models: the private key to --key, the public key to KEY.pub."""
    public = generate_key(key)
    public_path = key.with_name(key.name + ".pub")
    public_path.write_text(public_key_text(public) + "\n")
    # soft_wrap: lines meant to be copied must not be broken at the terminal's width
    console.print(f"private key: {key} (keep it where models are built, not where workers run)", soft_wrap=True)
    console.print(f"public key:  {public_path} (key id {key_id(public)})", soft_wrap=True)
    console.print(f"workers trust it with: CALLQA_MODEL_PUBLIC_KEY={public_key_text(public)}", soft_wrap=True)


@models_app.command("sign")
def sign(
    name: Annotated[str, typer.Argument(help="Model name, e.g. tiny.en.")],
    key: Annotated[Path, typer.Option(help="Ed25519 private key file (callqa models keygen).")],
    version: Annotated[int | None, typer.Option(help="Version to sign (default: the newest).")] = None,
) -> None:
    """Sign a built version's manifest (after checking every file against it): writes manifest.json.sig."""
    from pipeline.asr.manifest import latest_model_folder

    models_dir = Path(get_settings().models_dir)
    folder = latest_model_folder(models_dir, name) if version is None else models_dir / name / str(version)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such model version (callqa models list)")
    private = load_private_key(key)
    if key.stat().st_mode & 0o077:
        err_console.print(f"[yellow]warning[/yellow] {key}: readable by others (chmod 600 {key})")
    target = sign_model(folder, private)
    console.print(f"signed {folder} with key {key_id(private.public_key())}: {target.name}")


@models_app.command("list")
def list_models(
    as_json: Annotated[bool, typer.Option(
        "--json", help='The same rows as a JSON list on stdout: {"model", "version", "signer" (key id or null), '
                       '"source_package", "source_version", "graphs", "tools", "path"}.')] = False,
) -> None:
    """Built models and their versions."""
    from pipeline.tables import keep_whole, print_json, print_table

    models_dir = Path(get_settings().models_dir)
    built = built_models(models_dir)
    if as_json:
        print_json(built)
        return
    if not built:
        console.print(f"no model built in {models_dir} (run: callqa models build {get_settings().model})")
        return
    table = keep_whole(Table("model", "version", "source", "graphs", "tools"), "model", "version", "source")
    for m in built:
        signed = f"signed\n{m['signer'][:8]}" if m["signer"] else "unsigned"
        tools = ", ".join(f"{k} {v}" for k, v in m["tools"].items())
        source = f"{m['source_package']} {m['source_version']}"
        table.add_row(escape(m["model"]), f"{m['version']}\n{signed}", escape(source), ", ".join(m["graphs"]),
                      escape(tools))
    print_table(console, table, optional=("tools",))


def built_models(models_dir: Path) -> list[dict[str, Any]]:
    """Every built version, oldest first per model: ``callqa models list --json``'s rows."""
    names = sorted(p.name for p in models_dir.iterdir() if p.is_dir()) if models_dir.is_dir() else []
    rows = []
    for name in names:
        for version in model_versions(models_dir, name):
            folder = models_dir / name / str(version)
            m = Manifest.read(folder)
            rows.append({"model": name, "version": version,
                         "signer": signer_id(folder) or None,  # the claimed key id; loading verifies it
                         "source_package": m.source_package, "source_version": m.source_version,
                         "graphs": list(m.graphs), "tools": m.tools, "path": str(folder)})
    return rows


def transcribe(
    paths: Annotated[list[Path], typer.Argument(
        help="Audio files, any channels and rate: WAV (PCM, float, μ-law, A-law), FLAC, OGG Vorbis/Opus, MP3, ..., "
             "or headerless .ulaw/.alaw (8 kHz), .raw/.pcm (16 kHz).")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per segment on stdout.")] = False,
    model: Annotated[str | None, typer.Option(help="Model name (default: the model setting).")] = None,
) -> None:
    """Transcribe files through the streaming front end, segmenter and batcher; print segments.

    A file that cannot be read or transcribed is one line on stderr; the others are still transcribed,
    and the exit status is 1 if any failed."""
    failures = asyncio.run(_transcribe_all(paths, model, as_json))
    if failures:
        raise typer.Exit(1)


async def _transcribe_all(paths: list[Path], model: str | None, as_json: bool) -> int:
    from pipeline.asr.engine import Engine

    engine = Engine.load(model)
    batcher = engine.new_batcher()
    await batcher.start()
    failures = 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True, disable=as_json) as progress:
        for path in paths:
            try:
                task = progress.add_task(f"{path.name}: segmenting", total=None)
                pairs = await asyncio.to_thread(engine.file_segments, path)
                progress.update(task, description=f"{path.name}: transcribing", total=len(pairs))
                results = await asyncio.gather(*(_submit(batcher, ch, s, progress, task) for ch, s in pairs))
                _print(path, sorted(results, key=lambda r: (r.start_ms, r.channel)), as_json)
            except AudioFileError as exc:  # its message names the file and the cause
                failures += 1
                err_console.print(f"[red]error:[/red] {escape(str(exc))}")
            except Exception as exc:  # noqa: BLE001 - one line per failed file, then go on
                failures += 1
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                err_console.print(f"[red]error:[/red] {escape(str(path))}: {escape(reason)}")
    await batcher.close()
    return failures


async def _submit(
    batcher: SegmentBatcher, channel: int, segment: SpeechSegment, progress: Progress, task: TaskID
) -> TranscriptResult:
    result = await batcher.submit(segment)
    progress.advance(task)
    return replace(result, channel=channel)


def _print(path: Path, results: list[TranscriptResult], as_json: bool) -> None:
    spoken = [r for r in results if not r.is_silence]
    if as_json:
        for r in spoken:
            print(json.dumps({"file": str(path), **r.as_dict()}))
        return
    console.print(f"[bold]{path}[/bold]")
    for r in spoken:
        leg = f" ch{r.channel}" if any(x.channel for x in results) else ""
        console.print(f"  [{r.start_ms / 1000:7.2f} → {r.end_ms / 1000:7.2f}]{leg} {r.text}")
