//! Text data for language-model jobs: the built-in `austen` corpus, its fixed training /
//! validation split, a byte-level BPE tokenizer trained on the training split, the token
//! streams, and the per-node batch stream any auditor can replay (DESIGN §6: a recipe is
//! everything a validator needs to replay a node's work).
//!
//! Units: lengths and offsets are in **tokens** unless they say **bytes** (of UTF-8; the
//! split is defined on bytes).
//!
//! # Corpus
//!
//! [`NOVELS`]: Jane Austen's six finished novels, compiled in with `include_str!` from
//! `crates/train/data/austen/` (public domain, originally from Project Gutenberg; exported
//! from the CRAN package `janeaustenr` by Julia Silge, MIT — that folder's `README.md` gives
//! the export command, the sizes and the SHA-256 of every file). 4,025,029 bytes of UTF-8
//! in all, ASCII but for one `£` (2 bytes) in *Mansfield Park*; hard-wrapped lines as the
//! package stores them, `\n` line ends, a blank line between paragraphs.
//!
//! The models train on the paragraphs, not on the print layout: [`unwrap_paragraphs`]
//! joins each paragraph's lines with one space (a line break inside a paragraph is where
//! the package wrapped it at ~72 columns, not a token the text means) and separates
//! paragraphs by exactly one blank line. Without it every 13th token of the corpus is a
//! `"\n"` a small model cannot place, and greedy samples drift into runs of line breaks.
//!
//! # Split
//!
//! Fixed and independent of any recipe, so nodes, validators and auditors share it
//! ([`split_novel`], [`Split::from_novels`]), on the unwrapped novels. Each novel `t` of
//! `n` bytes is cut at the
//! first blank line at or after 95 % of it: `j` is the smallest byte offset
//! `≥ n − ⌊n / 20⌋` (that is `≥ ⌈0.95 n⌉`) with `t[j..j + 2] == "\n\n"`. The novel's
//! training part is `t[..j]`, its validation part `t[j + 2..]`: the two parts and the cut
//! `"\n\n"` between them make up the novel exactly, so no byte is in both (leak-free) and
//! only the two cut bytes are in neither. The training text is the six training parts
//! joined with [`SEPARATOR`] (`"\n\n"`) in the order of [`NOVELS`]; the validation text is
//! the six validation parts joined the same way. In Python, on each file's text `t`:
//! `t = "\n\n".join(q for q in (" ".join(l.strip() for l in p.split("\n") if l.strip())
//! for p in re.split(r"\n{2,}", t)) if q).encode()`, then
//! `j = t.index(b"\n\n", len(t) - len(t) // 20); train, val = t[:j], t[j + 2:]`, then
//! `b"\n\n".join(...)`. For `austen`: 3,826,740 training and 195,579 validation bytes.
//!
//! # Tokenizer
//!
//! [`train_tokenizer`]: Hugging Face `tokenizers` (the Rust library behind
//! `transformers`' fast tokenizers), a BPE model trained with `BpeTrainer` on the training
//! text (the word counts are those of the pre-tokenized training text), `ByteLevel`
//! pre-tokenizer (GPT-2's regex, no prefix space), `ByteLevel` decoder and post-processor
//! (which adds no tokens), no normalizer, no minimum pair frequency. Ids: **0** is the one
//! special token [`EOS`] (`<|endoftext|>`), **1–256** are the 256 byte-level characters
//! (sorted by code point), **257…** the merges in the order they were learnt (so any text
//! encodes, and decoding is lossless). The built-in tokenizer, [`Tokenizer::austen`], has
//! [`AUSTEN_VOCAB`] = 2048 ids and is committed as `data/austen/tokenizer.json`.
//!
//! Training is deterministic: the trainer takes merges by (count, then smallest pair of
//! ids), with ids assigned in a fixed order, and `tokenizers` serialises the vocabulary by
//! id; the same text and size give byte-identical JSON within a process and across
//! processes (whose hash seeds differ) and thread counts (a test retrains and compares
//! with the committed file; 1, 2 and 7 threads were checked). Python's `tokenizers`
//! 0.23 trained the same way gives the same vocabulary and merges. Regenerate the file
//! with
//! `cargo test -p hanzod-train --lib text::tests::regenerate_austen_tokenizer -- --ignored`.
//!
//! # Token streams and batches
//!
//! [`TextData`]: the training and validation texts each encoded as a whole (the ids
//! `transformers` gives for the whole text; no special tokens inserted, no EOS between
//! novels — the `"\n\n"` separator is their boundary). A node's batch at a step is
//! [`batch_windows`]: `batch` window starts drawn from ChaCha20 seeded with
//! SHA-256(seed ‖ job ‖ node key ‖ step), the seeding of the tabular `batch_indices`.
//! [`batch_tokens`] gathers them into `[batch, seq_len + 1]` token rows: inputs
//! `row[..seq_len]`, next-token targets `row[1..]`. The validation shard is
//! [`validation_windows`]: the leading non-overlapping windows of the validation stream,
//! the same for every node.

use std::collections::HashSet;
use std::sync::OnceLock;

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;
use sha2::{Digest, Sha256};
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, ModelWrapper, PreTokenizerWrapper, TokenizerImpl};

use crate::data::uniform_index;

/// The built-in text data set's name (a job's `TrainingSpec` dataset).
pub const AUSTEN: &str = "austen";

/// Vocabulary size of the built-in tokenizer ([`Tokenizer::austen`]), in token ids.
pub const AUSTEN_VOCAB: usize = 2048;

/// The tokenizer's one special token, end of text: id 0 in every tokenizer
/// [`train_tokenizer`] makes.
pub const EOS: &str = "<|endoftext|>";

/// What joins the six novels' parts into one training (or validation) text.
pub const SEPARATOR: &str = "\n\n";

/// Smallest vocabulary [`train_tokenizer`] accepts: [`EOS`] and the 256 byte-level
/// characters.
pub const MIN_VOCAB: usize = 257;

/// Largest vocabulary [`train_tokenizer`] accepts (ids are `u32`).
pub const MAX_VOCAB: usize = u32::MAX as usize;

/// The corpus: (title, full text) of Jane Austen's six novels, in this fixed order (the
/// order of the split's joins). UTF-8 (ASCII but for one `£`), `\n` line ends; see the
/// module documentation and `data/austen/README.md` for the source.
pub const NOVELS: [(&str, &str); 6] = [
    (
        "Sense and Sensibility",
        include_str!("../data/austen/sensesensibility.txt"),
    ),
    (
        "Pride and Prejudice",
        include_str!("../data/austen/prideprejudice.txt"),
    ),
    (
        "Mansfield Park",
        include_str!("../data/austen/mansfieldpark.txt"),
    ),
    ("Emma", include_str!("../data/austen/emma.txt")),
    (
        "Northanger Abbey",
        include_str!("../data/austen/northangerabbey.txt"),
    ),
    ("Persuasion", include_str!("../data/austen/persuasion.txt")),
];

/// The committed built-in tokenizer (`tokenizer.json` format).
const AUSTEN_TOKENIZER_JSON: &str = include_str!("../data/austen/tokenizer.json");

/// Why a text-data call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// A `tokenizer.json` that does not parse, or that is not usable here: no special
    /// [`EOS`] token, truncation or padding configured, or text that does not survive an
    /// encode / decode round trip (not byte-level).
    #[error("invalid tokenizer JSON: {0}")]
    TokenizerJson(String),
    /// `tokenizers` failed to train the BPE model.
    #[error("tokenizer training failed: {0}")]
    Training(String),
    /// A vocabulary size outside `MIN_VOCAB..=MAX_VOCAB`.
    #[error("vocabulary size {0} (want {MIN_VOCAB} to {MAX_VOCAB})")]
    VocabSize(usize),
    /// A size that must be at least 1 was 0 (which one: `"batch"`, `"seq_len"`,
    /// `"shard_tokens"`).
    #[error("{0} is zero")]
    Zero(&'static str),
    /// A window of `window` tokens (`seq_len + 1`) does not fit in a stream of `tokens`.
    #[error("a window of {window} tokens does not fit in a stream of {tokens} tokens")]
    WindowTooLong {
        /// Window length, `seq_len + 1` tokens.
        window: u64,
        /// Stream length, tokens.
        tokens: u64,
    },
    /// A window start whose window runs past the end of the stream.
    #[error("window [{start}, {start} + {window}) runs past a stream of {tokens} tokens")]
    StartOutOfRange {
        /// The start offset, tokens.
        start: u64,
        /// Window length, `seq_len + 1` tokens.
        window: u64,
        /// Stream length, tokens.
        tokens: u64,
    },
    /// More than 2³² − 1 window starts to draw from (the draw takes 32-bit outputs).
    #[error("{0} window starts (at most 2^32 - 1)")]
    StreamTooLong(u64),
    /// A validation shard of fewer tokens than one window scores (`shard_tokens < seq_len`).
    #[error("a shard of {shard_tokens} tokens is shorter than one window of {seq_len}")]
    ShardTooSmall {
        /// The requested shard, tokens.
        shard_tokens: u64,
        /// Tokens one window scores.
        seq_len: u32,
    },
    /// A batch of `batch × (seq_len + 1)` tokens that does not fit in memory's address space.
    #[error("a batch of {batch} × {window} tokens overflows usize")]
    BatchTooLarge {
        /// Rows.
        batch: u64,
        /// Tokens per row.
        window: u64,
    },
    /// A novel with no blank line (`"\n\n"`) in its last 5 %: it cannot be split.
    #[error("{0}: no blank line in its last 5 %")]
    NoParagraphBreak(String),
}

// ---------------------------------------------------------------------------------------
// Split
// ---------------------------------------------------------------------------------------

/// A text's paragraphs without their hard line wraps (module docs, "Corpus"): the text
/// is cut into paragraphs at every run of two or more `\n`, each paragraph's lines are
/// trimmed of surrounding whitespace and the non-empty ones joined with one space, empty
/// paragraphs are dropped, and the paragraphs are joined with `"\n\n"`.
pub fn unwrap_paragraphs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for para in text.trim_matches('\n').split("\n\n") {
        let mut first = true;
        for line in para.split('\n') {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if first {
                if !out.is_empty() {
                    out.push_str(SEPARATOR);
                }
                first = false;
            } else {
                out.push(' ');
            }
            out.push_str(line);
        }
    }
    out
}

/// Splits one novel `text` (`n` bytes) at the first blank line at or after 95 % of it: the
/// smallest byte offset `j ≥ n − ⌊n / 20⌋` with `text[j..j + 2] == "\n\n"`. Returns
/// `(text[..j], text[j + 2..])`, the training and validation parts (so
/// `train + "\n\n" + validation == text`), or `None` when there is no such blank line.
pub fn split_novel(text: &str) -> Option<(&str, &str)> {
    let b = text.as_bytes();
    let from = b.len() - b.len() / 20;
    let j = from + b[from..].windows(2).position(|w| w == b"\n\n")?;
    // `j` and `j + 2` sit next to ASCII newlines, so both are char boundaries.
    Some((&text[..j], &text[j + 2..]))
}

/// A corpus' training and validation text (module documentation, "Split").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The novels' training parts joined with [`SEPARATOR`], in corpus order.
    pub train: String,
    /// The novels' validation parts joined with [`SEPARATOR`], in corpus order.
    pub validation: String,
}

impl Split {
    /// The split of [`NOVELS`]: 3,826,740 training and 195,579 validation bytes (computed
    /// on each call, a few milliseconds; [`TextData::austen`] keeps the tokens).
    pub fn austen() -> Split {
        Split::from_novels(&NOVELS).expect("every novel has a blank line in its last 5 % (tested)")
    }

    /// Unwraps every `(title, text)` ([`unwrap_paragraphs`]), splits it with
    /// [`split_novel`] and joins the parts in the order given.
    /// [`TextError::NoParagraphBreak`] (naming the title) when a text has no blank line in
    /// its last 5 %.
    pub fn from_novels(novels: &[(&str, &str)]) -> Result<Split, TextError> {
        let mut train = Vec::with_capacity(novels.len());
        let mut validation = Vec::with_capacity(novels.len());
        let unwrapped: Vec<String> = novels.iter().map(|(_, t)| unwrap_paragraphs(t)).collect();
        for ((title, _), text) in novels.iter().zip(&unwrapped) {
            let (t, v) =
                split_novel(text).ok_or_else(|| TextError::NoParagraphBreak(title.to_string()))?;
            train.push(t);
            validation.push(v);
        }
        Ok(Split {
            train: train.join(SEPARATOR),
            validation: validation.join(SEPARATOR),
        })
    }
}

// ---------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------

/// A byte-level BPE tokenizer (Hugging Face `tokenizers`), checked on construction: a BPE
/// model with the special token [`EOS`], no truncation or padding, and it round-trips
/// text holding every byte value UTF-8 uses. Immutable and `Send + Sync`; share one
/// instance.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos: u32,
    vocab: usize,
    /// [`piecewise`]: long texts may be encoded in pieces cut by [`cut_pieces`].
    piecewise: bool,
}

impl Tokenizer {
    /// The built-in tokenizer: `data/austen/tokenizer.json`, [`AUSTEN_VOCAB`] ids, trained
    /// by [`train_tokenizer`] on [`Split::austen`]'s training text.
    ///
    /// Parsed once per process and kept in a `OnceLock` (a `&'static`): it is immutable,
    /// `Send + Sync`, and one instance lets every caller share the BPE model's word cache;
    /// clone it when ownership is needed.
    ///
    /// # Panics
    ///
    /// Never for the committed file (tested); only if it were replaced by an invalid one.
    pub fn austen() -> &'static Tokenizer {
        static AUSTEN_TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
        AUSTEN_TOKENIZER.get_or_init(|| {
            Tokenizer::from_json(AUSTEN_TOKENIZER_JSON)
                .expect("the committed data/austen/tokenizer.json is valid (tested)")
        })
    }

    /// A tokenizer from `tokenizer.json` text (as written by [`Tokenizer::to_json`] or by
    /// `transformers`' `save_pretrained`). [`TextError::TokenizerJson`] when it does not
    /// parse or fails the checks of [`Tokenizer`].
    pub fn from_json(json: &str) -> Result<Tokenizer, TextError> {
        let inner: tokenizers::Tokenizer = json
            .parse()
            .map_err(|e| TextError::TokenizerJson(format!("{e}")))?;
        Tokenizer::checked(inner)
    }

    fn checked(inner: tokenizers::Tokenizer) -> Result<Tokenizer, TextError> {
        let bad = |m: String| Err(TextError::TokenizerJson(m));
        if !matches!(inner.get_model(), ModelWrapper::BPE(_)) {
            return bad("the model is not BPE".into());
        }
        if inner.get_truncation().is_some() || inner.get_padding().is_some() {
            return bad("truncation or padding is configured".into());
        }
        let Some(eos) = inner.token_to_id(EOS) else {
            return bad(format!("no {EOS} token"));
        };
        if !inner
            .get_added_tokens_decoder()
            .get(&eos)
            .is_some_and(|t| t.special)
        {
            return bad(format!("{EOS} is not a special token"));
        }
        let vocab = inner
            .get_vocab(true)
            .into_values()
            .max()
            .map_or(0, |m| m as usize + 1);
        let probe = byte_probe();
        let ids = match inner.encode_fast(probe.as_str(), false) {
            Ok(enc) => enc.get_ids().to_vec(),
            Err(e) => return bad(format!("encoding fails: {e}")),
        };
        match inner.decode(&ids, false) {
            Ok(s) if s == probe => {}
            Ok(_) => return bad("text does not survive encode / decode (not byte-level)".into()),
            Err(e) => return bad(format!("decoding fails: {e}")),
        }
        let piecewise = piecewise(&inner);
        Ok(Tokenizer {
            inner,
            eos,
            vocab,
            piecewise,
        })
    }

    /// The token ids of `text`, `[n]` (about 3.3 bytes per token for Austen's prose at
    /// vocabulary 2048): exactly what `tokenizers` (and `transformers`) give for the whole
    /// text. Adds no special tokens; the literal text `<|endoftext|>` is matched as
    /// [`EOS`], as in `transformers`.
    ///
    /// A text over 16 KiB is encoded in pieces of about 16 KiB cut at line starts where no
    /// token can span the cut (see `cut_pieces`), 64 pieces at a time on `tokenizers`'
    /// rayon pool (sequential with `TOKENIZERS_PARALLELISM=false`). The ids are the same;
    /// the transient memory (`tokenizers` holds about 130 bytes per byte of text while it
    /// encodes) is bounded by the 1 MiB batch rather than by the text: encoding the 3.8 MB
    /// training text at once would peak near 500 MB, in pieces it takes about 35 MB.
    ///
    /// # Panics
    ///
    /// Only if `tokenizers` reported an error, which a byte-level BPE (checked on
    /// construction) does not for any UTF-8 text.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        const BROKEN: &str = "a byte-level BPE encodes any text";
        if !self.piecewise || text.len() <= PIECE_BYTES {
            return self
                .inner
                .encode_fast(text, false)
                .expect(BROKEN)
                .get_ids()
                .to_vec();
        }
        let mut ids = Vec::with_capacity(text.len() / 3);
        for batch in cut_pieces(text, PIECE_BYTES).chunks(PIECES_PER_BATCH) {
            let encodings = self
                .inner
                .encode_batch_fast(batch.to_vec(), false)
                .expect(BROKEN);
            for e in &encodings {
                ids.extend_from_slice(e.get_ids());
            }
        }
        ids
    }

    /// The text of `ids`, special tokens included (`decode(encode(t)) == t` for any `t`).
    /// Ids outside `0..vocab_size()` are skipped (as `tokenizers` does).
    ///
    /// # Panics
    ///
    /// Only if `tokenizers` reported an error, which its byte-level decoder does not (it
    /// replaces invalid UTF-8 with U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner
            .decode(ids, false)
            .expect("the byte-level decoder does not fail")
    }

    /// Number of ids, `max id + 1` (the ids are `0..vocab_size()`, special token included):
    /// the embedding rows a model needs.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The id of [`EOS`], `<|endoftext|>` (0 for tokenizers [`train_tokenizer`] makes).
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// The `tokenizer.json` text (pretty-printed, as `tokenizers` saves it): with
    /// [`tokenizer_config_json`] beside it, `transformers.AutoTokenizer.from_pretrained`
    /// loads it.
    pub fn to_json(&self) -> String {
        self.inner
            .to_string(true)
            .expect("serialising a tokenizer to JSON does not fail")
    }
}

/// Target length of the pieces [`Tokenizer::encode`] and [`train_tokenizer`] cut a long
/// text into, bytes (a piece ends at the first safe cut at or after it).
const PIECE_BYTES: usize = 16 * 1024;

/// Pieces per `encode_batch` call in [`Tokenizer::encode`] (1 MiB of text at a time).
const PIECES_PER_BATCH: usize = 64;

/// Whether `tk` gives the same ids for a text and for the concatenation of its
/// [`cut_pieces`]: no normalizer, the `ByteLevel` pre-tokenizer with its GPT-2 regex and
/// no prefix space, and added tokens that hold no newline and strip nothing around them.
/// (The tokenizers made here all qualify; others are encoded whole.)
fn piecewise(tk: &tokenizers::Tokenizer) -> bool {
    let byte_level = matches!(
        tk.get_pre_tokenizer(),
        Some(PreTokenizerWrapper::ByteLevel(b)) if b.use_regex && !b.add_prefix_space
    );
    byte_level
        && tk.get_normalizer().is_none()
        && tk
            .get_added_tokens_decoder()
            .values()
            .all(|t| !t.content.contains('\n') && !t.lstrip && !t.rstrip && !t.single_word)
}

/// Cuts `text` into consecutive pieces of at least `target` bytes (the last may be
/// shorter), each cut at the first byte offset `p` at or after the piece's start +
/// `target` with `text[p − 1] == '\n'`, `text[p − 2]` printable ASCII (`!`–`~`), and
/// either `text[p]` printable ASCII (the start of a line that follows a line without
/// trailing whitespace and itself starts with a visible character) or `text[p] == '\n'`
/// and `text[p + 1]` printable ASCII (between the two newlines of a blank line that
/// separates two such lines: the unwrapped corpus's paragraph break). `target ≥ 2`.
///
/// Why no token spans such a cut (for a [`piecewise`] tokenizer): added tokens hold no
/// newline, so none covers `p − 1`. The pre-tokenizer's regex,
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, has
/// alternatives that are either all whitespace or hold no whitespace but a leading space,
/// so the match holding the visible `text[p − 2]` ends at `p − 1`; at `p − 1` the newline
/// followed by a visible character is the match `\s+` of exactly `[p − 1, p)` (and at
/// the end of the first piece, `\s+(?!\S)` matches the same single newline); matching
/// then restarts at `p` on the same text in both cases. Between the two newlines of
/// `"X\n\nY"`: in the whole text `\s+(?!\S)` cannot take both newlines (a visible `Y`
/// follows), so it takes the first alone and `\s+` the second; at the end of the first
/// piece `\s+(?!\S)` takes that same first newline, and the second piece starts with the
/// same `\s+` match of the second. BPE merges only within a pre-token, so the ids of the
/// pieces, concatenated, are the ids of the text (tested).
fn cut_pieces(text: &str, target: usize) -> Vec<&str> {
    debug_assert!(target >= 2);
    let b = text.as_bytes();
    let safe = |p: usize| {
        b[p - 1] == b'\n'
            && b[p - 2].is_ascii_graphic()
            && (b[p].is_ascii_graphic()
                || (b[p] == b'\n' && b.get(p + 1).is_some_and(u8::is_ascii_graphic)))
    };
    let mut pieces = Vec::with_capacity(b.len() / target + 1);
    let mut start = 0;
    while b.len() - start > target {
        match (start + target..b.len()).find(|&p| safe(p)) {
            // `p` follows an ASCII newline: a char boundary.
            Some(p) => {
                pieces.push(&text[start..p]);
                start = p;
            }
            None => break,
        }
    }
    pieces.push(&text[start..]);
    pieces
}

/// One character for each byte value UTF-8 text can hold: ASCII `0x00–0x7F`,
/// continuation bytes `0x80–0xBF` (U+0080–U+00BF), every 2-, 3- and 4-byte lead byte
/// (`0xC2–0xDF`, `0xE0–0xEF`, `0xF0–0xF4`).
fn byte_probe() -> String {
    let cps = (0u32..0x80)
        .chain(0x80..0xC0)
        .chain((0..30).map(|k| 0x80 + 64 * k))
        .chain((0..16).map(|k| if k == 0 { 0x800 } else { 0x1000 * k }))
        .chain([0x10000, 0x40000, 0x80000, 0xC0000, 0x10_0000]);
    cps.map(|c| char::from_u32(c).expect("no surrogates in the probe"))
        .collect()
}

/// Trains a byte-level BPE tokenizer of at most `vocab_size` ids on `train_text` (module
/// documentation, "Tokenizer"): id 0 is [`EOS`], 1–256 the byte-level alphabet, then
/// merges in order of pair count until `vocab_size` ids, or until no pair is left to merge
/// (a short text may give fewer ids). The trainer counts the pre-tokens of the text,
/// which it is fed in the pieces [`Tokenizer::encode`] cuts (the same counts as the text
/// in one sequence, and parallel). Deterministic: the same text and size give the same
/// [`Tokenizer::to_json`]. [`TextError::VocabSize`] outside `MIN_VOCAB..=MAX_VOCAB`;
/// [`TextError::Training`] if `tokenizers` fails.
///
/// About 1.5 s (release build) to 3 s (debug build) for the 3.8 MB `austen` training
/// text at vocabulary 2048.
pub fn train_tokenizer(train_text: &str, vocab_size: usize) -> Result<Tokenizer, TextError> {
    if !(MIN_VOCAB..=MAX_VOCAB).contains(&vocab_size) {
        return Err(TextError::VocabSize(vocab_size));
    }
    let byte_level = ByteLevel::new(false, false, true);
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(0)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(EOS, true)])
        .initial_alphabet(alphabet)
        .build();
    let mut tk: TokenizerImpl<BPE, NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel> =
        TokenizerImpl::new(BPE::default());
    tk.with_pre_tokenizer(Some(byte_level))
        .with_post_processor(Some(byte_level))
        .with_decoder(Some(byte_level));
    let pieces = cut_pieces(train_text, PIECE_BYTES);
    tk.train(&mut trainer, pieces.into_iter())
        .map_err(|e| TextError::Training(format!("{e}")))?;
    Tokenizer::checked(tokenizers::Tokenizer::from(tk))
        .map_err(|e| TextError::Training(format!("the trained tokenizer: {e}")))
}

/// The `tokenizer_config.json` that makes `transformers.AutoTokenizer.from_pretrained(dir)`
/// load `dir/tokenizer.json` ([`Tokenizer::to_json`]) as a `PreTrainedTokenizerFast`
/// (transformers 5: `TokenizersBackend`), with the same ids as [`Tokenizer::encode`]:
/// `tokenizer_class` `PreTrainedTokenizerFast` (not `Qwen2Tokenizer`, which would rebuild
/// the pipeline with Qwen's own regex and NFC), `eos_token` [`EOS`], no BOS / PAD / UNK
/// token, nothing added around a text, `clean_up_tokenization_spaces` false, and
/// `model_max_length` = the model's context length in tokens (a job's sequence limit; the
/// tokenizer itself has none). Pretty-printed JSON with sorted keys.
///
/// Checked with transformers 5.24: `AutoTokenizer.from_pretrained` on a directory with
/// both files (with or without a Qwen3 `config.json` beside them) gives exactly
/// [`TextData::austen`]'s ids for the whole training and validation texts, EOS id 0, no
/// BOS, and decodes them back to the texts.
pub fn tokenizer_config_json(tokenizer: &Tokenizer, model_max_length: u64) -> String {
    let eos = serde_json::json!({
        "content": EOS,
        "lstrip": false,
        "normalized": false,
        "rstrip": false,
        "single_word": false,
        "special": true,
    });
    let mut added = serde_json::Map::new();
    added.insert(tokenizer.eos_id().to_string(), eos);
    let config = serde_json::json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": added,
        "bos_token": null,
        "clean_up_tokenization_spaces": false,
        "eos_token": EOS,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": null,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": null,
    });
    serde_json::to_string_pretty(&config).expect("a JSON value serialises")
}

// ---------------------------------------------------------------------------------------
// Token streams
// ---------------------------------------------------------------------------------------

/// A corpus' token streams: the training and the validation text each encoded whole
/// ([`Tokenizer::encode`], no special tokens added), and the tokenizer.
#[derive(Debug, Clone)]
pub struct TextData {
    tokenizer: Tokenizer,
    /// Training stream, `[train_len]` token ids.
    train: Vec<u32>,
    /// Validation stream, `[validation_len]` token ids.
    validation: Vec<u32>,
}

impl TextData {
    /// The built-in data set [`AUSTEN`]: [`Split::austen`] encoded with
    /// [`Tokenizer::austen`], 1,081,401 training and 54,709 validation tokens. Tokenized
    /// once per process (about 1.5 s in a release build, 2–3 s in a debug build) and kept
    /// in a `OnceLock`: it is immutable (4.5 MB of ids).
    pub fn austen() -> &'static TextData {
        static AUSTEN_DATA: OnceLock<TextData> = OnceLock::new();
        AUSTEN_DATA.get_or_init(|| TextData::new(Tokenizer::austen().clone(), &Split::austen()))
    }

    /// Encodes `split.train` and `split.validation` with `tokenizer`.
    pub fn new(tokenizer: Tokenizer, split: &Split) -> TextData {
        let train = tokenizer.encode(&split.train);
        let validation = tokenizer.encode(&split.validation);
        TextData {
            tokenizer,
            train,
            validation,
        }
    }

    /// The tokenizer the streams were encoded with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The training stream, `[train_len]` token ids.
    pub fn train(&self) -> &[u32] {
        &self.train
    }

    /// The validation stream, `[validation_len]` token ids.
    pub fn validation(&self) -> &[u32] {
        &self.validation
    }

    /// Length of the training stream, tokens.
    pub fn train_len(&self) -> usize {
        self.train.len()
    }

    /// Length of the validation stream, tokens.
    pub fn validation_len(&self) -> usize {
        self.validation.len()
    }
}

// ---------------------------------------------------------------------------------------
// Batches
// ---------------------------------------------------------------------------------------

/// The per-node data-stream generator: ChaCha20 seeded with SHA-256(`seed` as u64 LE ‖
/// `job` as u64 LE ‖ the node's 32 key bytes ‖ `step` as u64 LE). The one seeding of every
/// replayable batch stream (text windows here, tabular sample indices in
/// `batch_indices`).
pub(crate) fn stream_rng(seed: u64, job: u64, node: &[u8; 32], step: u64) -> ChaCha20Rng {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(job.to_le_bytes());
    h.update(node);
    h.update(step.to_le_bytes());
    ChaCha20Rng::from_seed(h.finalize().into())
}

/// Number of windows of `seq_len + 1` tokens a stream of `tokens` holds: the valid starts
/// are `0..tokens − seq_len`.
fn window_starts(seq_len: u32, tokens: usize) -> Result<usize, TextError> {
    if seq_len == 0 {
        return Err(TextError::Zero("seq_len"));
    }
    let window = u64::from(seq_len) + 1;
    if (tokens as u64) < window {
        return Err(TextError::WindowTooLong {
            window,
            tokens: tokens as u64,
        });
    }
    Ok(tokens - seq_len as usize)
}

/// The window starts (offsets into the training stream, tokens) of `node`'s batch at
/// global step `step`, `[batch]`: `batch` independent uniform draws (with replacement) in
/// `0..=train_tokens − (seq_len + 1)`, in row order, each window being `seq_len + 1` tokens
/// (inputs and their next-token targets). The generator is ChaCha20 (`rand_chacha`
/// 0.3, 20 rounds) seeded with the 32 bytes SHA-256(`seed` as u64 LE ‖ `job` as u64 LE ‖
/// the node's 32 key bytes ‖ `step` as u64 LE); each draw takes 32-bit outputs `r`
/// (ChaCha `next_u32`), rejects `r ≥ 2³² − (2³² mod m)` and returns `r mod m`, with
/// `m = train_tokens − seq_len` the number of valid starts — the scheme of the tabular
/// `batch_indices`, so an auditor replays both the same way.
///
/// Errors: [`TextError::Zero`] for `batch` or `seq_len` 0, [`TextError::WindowTooLong`]
/// when `train_tokens < seq_len + 1`, [`TextError::StreamTooLong`] for more than 2³² − 1
/// starts. Allocates `batch` entries: callers bound `batch` (as the recipe check does).
pub fn batch_windows(
    seed: u64,
    job: u64,
    node: &[u8; 32],
    step: u64,
    batch: u32,
    seq_len: u32,
    train_tokens: usize,
) -> Result<Vec<usize>, TextError> {
    if batch == 0 {
        return Err(TextError::Zero("batch"));
    }
    let m = window_starts(seq_len, train_tokens)?;
    if m as u64 > u64::from(u32::MAX) {
        return Err(TextError::StreamTooLong(m as u64));
    }
    let mut rng = stream_rng(seed, job, node, step);
    Ok((0..batch).map(|_| uniform_index(&mut rng, m)).collect())
}

/// Gathers the windows `tokens[s..s + seq_len + 1]` for each `s` in `starts`, row-major
/// `[starts.len(), seq_len + 1]` token ids: row `i`'s inputs are `[..seq_len]`, its
/// targets `[1..]`.
///
/// Errors: [`TextError::Zero`] for `seq_len` 0 or no starts,
/// [`TextError::StartOutOfRange`] when a window runs past the stream,
/// [`TextError::BatchTooLarge`] when the result cannot be addressed.
pub fn batch_tokens(tokens: &[u32], starts: &[usize], seq_len: u32) -> Result<Vec<u32>, TextError> {
    if seq_len == 0 {
        return Err(TextError::Zero("seq_len"));
    }
    if starts.is_empty() {
        return Err(TextError::Zero("batch"));
    }
    let window = seq_len as usize + 1;
    let total = starts
        .len()
        .checked_mul(window)
        .ok_or(TextError::BatchTooLarge {
            batch: starts.len() as u64,
            window: window as u64,
        })?;
    if let Some(&start) = starts
        .iter()
        .find(|&&s| s.checked_add(window).is_none_or(|end| end > tokens.len()))
    {
        return Err(TextError::StartOutOfRange {
            start: start as u64,
            window: window as u64,
            tokens: tokens.len() as u64,
        });
    }
    let mut out = Vec::with_capacity(total);
    for &s in starts {
        out.extend_from_slice(&tokens[s..s + window]);
    }
    Ok(out)
}

/// The validation shard a job fixes: the starts (tokens) `0, seq_len, 2·seq_len, …` of the
/// first `k = min(⌊shard_tokens / seq_len⌋, ⌊(validation_tokens − 1) / seq_len⌋)` windows
/// of `seq_len + 1` tokens — consecutive windows share one token (the last target of one
/// is the first input of the next), so each of the shard's tokens after the first is
/// scored exactly once, `k · seq_len` in all ([`validation_scored_tokens`]). The second
/// bound clips the shard to the windows the stream holds. The same for every node and
/// validator; no randomness.
///
/// Errors: [`TextError::Zero`] for `seq_len` or `shard_tokens` 0,
/// [`TextError::ShardTooSmall`] when `shard_tokens < seq_len`,
/// [`TextError::WindowTooLong`] when `validation_tokens < seq_len + 1`.
pub fn validation_windows(
    validation_tokens: usize,
    seq_len: u32,
    shard_tokens: u64,
) -> Result<Vec<usize>, TextError> {
    let k = validation_window_count(validation_tokens, seq_len, shard_tokens)?;
    Ok((0..k).map(|i| i * seq_len as usize).collect())
}

/// Tokens the shard of [`validation_windows`] scores (next-token predictions): windows ×
/// `seq_len`, at most `shard_tokens`. Same errors.
pub fn validation_scored_tokens(
    validation_tokens: usize,
    seq_len: u32,
    shard_tokens: u64,
) -> Result<u64, TextError> {
    let k = validation_window_count(validation_tokens, seq_len, shard_tokens)?;
    Ok(k as u64 * u64::from(seq_len))
}

fn validation_window_count(
    validation_tokens: usize,
    seq_len: u32,
    shard_tokens: u64,
) -> Result<usize, TextError> {
    if shard_tokens == 0 {
        return Err(TextError::Zero("shard_tokens"));
    }
    window_starts(seq_len, validation_tokens)?;
    let want = shard_tokens / u64::from(seq_len);
    if want == 0 {
        return Err(TextError::ShardTooSmall {
            shard_tokens,
            seq_len,
        });
    }
    let fit = (validation_tokens as u64 - 1) / u64::from(seq_len);
    Ok(want.min(fit) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand_chacha::rand_core::RngCore;

    #[test]
    fn corpus_is_complete() {
        let sizes: Vec<usize> = NOVELS.iter().map(|(_, t)| t.len()).collect();
        assert_eq!(
            sizes,
            [673_688, 684_768, 883_280, 883_028, 433_411, 466_854]
        );
        for (title, text) in NOVELS {
            assert!(!text.contains('\r'), "{title}");
            let non_ascii: Vec<char> = text.chars().filter(|c| !c.is_ascii()).collect();
            let want: &[char] = if title == "Mansfield Park" {
                &['\u{a3}']
            } else {
                &[]
            };
            assert_eq!(non_ascii, want, "{title}");
        }
    }

    #[test]
    fn split_is_leak_free_and_covers_every_byte_but_the_cuts() {
        let split = Split::austen();
        let mut train_parts = Vec::new();
        let mut val_parts = Vec::new();
        let unwrapped: Vec<String> = NOVELS.iter().map(|(_, t)| unwrap_paragraphs(t)).collect();
        let total: usize = unwrapped.iter().map(String::len).sum();
        for ((title, _), text) in NOVELS.iter().zip(&unwrapped) {
            let (t, v) = split_novel(text).unwrap();
            // The parts and the cut make up the novel exactly.
            assert_eq!(&format!("{t}\n\n{v}"), text, "{title}");
            // The cut is the first blank line at or after 95 %.
            let from = text.len() - text.len() / 20;
            assert!(t.len() >= from, "{title}");
            assert!(!text[from..t.len() + 1].contains("\n\n"), "{title}");
            // About 5 % goes to validation.
            let frac = v.len() as f64 / text.len() as f64;
            assert!((0.04..0.05).contains(&frac), "{title}: {frac}");
            train_parts.push(t);
            val_parts.push(v);
        }
        assert_eq!(split.train, train_parts.join("\n\n"));
        assert_eq!(split.validation, val_parts.join("\n\n"));
        // Each novel loses its 2 cut bytes; each text gains 5 separators of 2 bytes.
        assert_eq!(
            split.train.len() + split.validation.len(),
            total - 2 * 6 + 2 * 2 * 5
        );
        assert_eq!(
            (split.train.len(), split.validation.len()),
            (3_826_740, 195_579)
        );
        // No long validation line occurs as a line of the training text.
        let train_lines: HashSet<&str> = split.train.lines().collect();
        let shared: Vec<&str> = split
            .validation
            .lines()
            .filter(|l| l.len() >= 40 && train_lines.contains(l))
            .collect();
        assert!(shared.is_empty(), "{shared:?}");
    }

    #[test]
    fn unwrapping_joins_lines_and_keeps_paragraphs() {
        let t = "\nCHAPTER I\n\n\nEmma Woodhouse, handsome,\n  clever, and rich\n\n   \n\nShe was\nthe youngest.\n";
        assert_eq!(
            unwrap_paragraphs(t),
            "CHAPTER I\n\nEmma Woodhouse, handsome, clever, and rich\n\nShe was the youngest."
        );
        assert_eq!(unwrap_paragraphs(""), "");
        assert_eq!(unwrap_paragraphs("\n\n \n"), "");
        // Idempotent, and no wrapped line break is left in the corpus.
        for (title, text) in NOVELS {
            let u = unwrap_paragraphs(text);
            assert_eq!(unwrap_paragraphs(&u), u, "{title}");
            assert!(!u.contains("\n\n\n"), "{title}");
            assert!(
                u.split("\n\n").all(|p| !p.is_empty() && !p.contains('\n')),
                "{title}"
            );
        }
    }

    #[test]
    fn split_rule_on_small_texts() {
        // 40 bytes: the search starts at 40 − 2 = 38; the blank line at 37 is too early.
        let t = format!("{}\n\n{}", "a".repeat(37), "b");
        assert_eq!(t.len(), 40);
        assert_eq!(split_novel(&t), None);
        // 42 bytes: from 40; "\n\n" at 36 and 39 are both too early.
        let t = format!("{}\n\nx\n\ny", "a".repeat(36));
        assert_eq!(t.len(), 42);
        assert_eq!(split_novel(&t), None);
        // A blank line exactly at the start of the search; empty validation part.
        let t = format!("{}\n\n", "a".repeat(38));
        assert_eq!(split_novel(&t), Some((&t[..38], "")));
        // 100 bytes: from 95; the blank line at 90 is skipped, the one at 95 cuts.
        let t = format!("{}\n\nbbb\n\nccc", "a".repeat(90));
        assert_eq!(t.len(), 100);
        assert_eq!(split_novel(&t), Some((&t[..95], "ccc")));
        assert_eq!(
            Split::from_novels(&[("ok", &t), ("bad", "no blank line")]),
            Err(TextError::NoParagraphBreak("bad".into()))
        );
        assert_eq!(split_novel(""), None);
    }

    #[test]
    fn committed_tokenizer_loads_with_the_documented_ids() {
        let tok = Tokenizer::austen();
        assert_eq!(tok.vocab_size(), AUSTEN_VOCAB);
        assert_eq!(tok.eos_id(), 0);
        let vocab = tok.inner.get_vocab(true);
        assert_eq!(vocab.len(), AUSTEN_VOCAB, "ids are 0..2048, each once");
        // 1..=256: the byte-level alphabet, in code-point order.
        let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        alphabet.sort_unstable();
        for (i, c) in alphabet.iter().enumerate() {
            assert_eq!(vocab[&c.to_string()], i as u32 + 1);
        }
        assert_eq!(tok.encode("<|endoftext|>"), vec![0]);
        assert_eq!(tok.decode(&[0]), EOS);
        let s = "It is a truth universally acknowledged, \u{e9}\u{1F600}\0\t\r\n";
        assert_eq!(tok.decode(&tok.encode(s)), s);
        assert_eq!(
            Tokenizer::from_json(&tok.to_json()).unwrap().to_json(),
            tok.to_json()
        );
    }

    /// The ids of a text and of its pieces, concatenated: the same (`cut_pieces`).
    fn whole(tok: &Tokenizer, text: &str) -> Vec<u32> {
        tok.inner
            .encode_fast(text, false)
            .unwrap()
            .get_ids()
            .to_vec()
    }

    fn by_pieces(tok: &Tokenizer, text: &str, target: usize) -> Vec<u32> {
        let pieces = cut_pieces(text, target);
        assert_eq!(pieces.concat(), text);
        pieces.iter().flat_map(|p| whole(tok, p)).collect()
    }

    #[test]
    fn pieces_encode_as_the_whole_text() {
        let tok = Tokenizer::austen();
        assert!(tok.piecewise);
        // Awkward neighbours of newlines: spaces, tabs, CR, blank lines, contractions,
        // digits, punctuation, non-ASCII, the special token.
        const BITS: [&str; 20] = [
            "a",
            "Z",
            " ",
            "  ",
            "\n",
            "\n\n",
            "\t",
            "\r\n",
            "'s",
            "'",
            "'ll",
            "1",
            "23",
            ".",
            "--",
            "\u{a3}",
            "\u{e9}t\u{e9}",
            "\u{3000}",
            "<|endoftext|>",
            " word",
        ];
        let mut rng = ChaCha20Rng::from_seed([3; 32]);
        for _ in 0..300 {
            let len = 1 + uniform_index(&mut rng, 80);
            let text: String = (0..len)
                .map(|_| BITS[uniform_index(&mut rng, BITS.len())])
                .collect();
            let want = whole(tok, &text);
            for target in [2, 3, 7, 40] {
                assert_eq!(by_pieces(tok, &text, target), want, "{text:?} / {target}");
            }
        }
        // Real text, hundreds of cuts (one per paragraph).
        let split = Split::austen();
        let text = &split.validation[..100_000];
        assert!(
            cut_pieces(text, 32).len() > 200,
            "{}",
            cut_pieces(text, 32).len()
        );
        assert_eq!(by_pieces(tok, text, 32), whole(tok, text));
        assert_eq!(tok.encode(text), whole(tok, text));
        // Tokenizers the argument does not cover are encoded whole.
        let v: serde_json::Value = serde_json::from_str(&tok.to_json()).unwrap();
        let mut seq = v.clone();
        seq["pre_tokenizer"] = serde_json::json!({
            "type": "Sequence", "pretokenizers": [v["pre_tokenizer"].clone()]
        });
        let seq = Tokenizer::from_json(&seq.to_string()).unwrap();
        assert!(!seq.piecewise);
        assert_eq!(
            seq.encode(&split.validation),
            TextData::austen().validation()
        );
        let mut lstrip = v.clone();
        lstrip["added_tokens"][0]["lstrip"] = true.into();
        assert!(!Tokenizer::from_json(&lstrip.to_string()).unwrap().piecewise);
        // (A prefix space is refused outright: it does not round-trip.)
        let mut prefix = v;
        prefix["pre_tokenizer"]["add_prefix_space"] = true.into();
        assert!(Tokenizer::from_json(&prefix.to_string()).is_err());
    }

    /// Retraining on the training split gives the committed file byte for byte (each test
    /// run is a fresh process, with fresh hash seeds), and twice in one process too.
    #[test]
    fn retraining_reproduces_the_committed_tokenizer() {
        let split = Split::austen();
        let t0 = std::time::Instant::now();
        let tok = train_tokenizer(&split.train, AUSTEN_VOCAB).unwrap();
        eprintln!("trained the austen tokenizer in {:?}", t0.elapsed());
        let json = tok.to_json();
        assert!(
            json == AUSTEN_TOKENIZER_JSON,
            "retrained tokenizer differs from the committed file"
        );
        let again = train_tokenizer(&split.train, AUSTEN_VOCAB).unwrap();
        assert!(again.to_json() == json);
    }

    #[test]
    fn training_small_texts_and_bad_sizes() {
        assert_eq!(
            train_tokenizer("abc", 256).unwrap_err(),
            TextError::VocabSize(256)
        );
        let text = "the cat sat on the mat; the cat ate the rat. ".repeat(20);
        let a = train_tokenizer(&text, 300).unwrap();
        assert!(a.vocab_size() > MIN_VOCAB && a.vocab_size() <= 300);
        assert_eq!(a.eos_id(), 0);
        assert_eq!(a.to_json(), train_tokenizer(&text, 300).unwrap().to_json());
        assert!(a.encode(&text).len() < text.len() / 3);
        assert_eq!(a.decode(&a.encode(&text)), text);
        // No text at all: the alphabet only, still lossless.
        let empty = train_tokenizer("", 2048).unwrap();
        assert_eq!(empty.vocab_size(), MIN_VOCAB);
        assert_eq!(empty.decode(&empty.encode("xyz \u{e9}")), "xyz \u{e9}");
    }

    #[test]
    fn invalid_tokenizer_json_is_refused() {
        assert!(matches!(
            Tokenizer::from_json("{not json"),
            Err(TextError::TokenizerJson(_))
        ));
        // Without the special token.
        let json = Tokenizer::austen().to_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let mut no_eos = v.clone();
        no_eos["added_tokens"] = serde_json::json!([]);
        no_eos["model"]["vocab"]
            .as_object_mut()
            .unwrap()
            .remove(EOS);
        let e = Tokenizer::from_json(&no_eos.to_string()).unwrap_err();
        assert!(
            matches!(&e, TextError::TokenizerJson(m) if m.contains("no <|endoftext|>")),
            "{e}"
        );
        // Truncation changes ids: refused.
        let mut trunc = v.clone();
        trunc["truncation"] = serde_json::json!({
            "direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0
        });
        let e = Tokenizer::from_json(&trunc.to_string()).unwrap_err();
        assert!(
            matches!(&e, TextError::TokenizerJson(m) if m.contains("truncation")),
            "{e}"
        );
        // Not byte-level (no pre-tokenizer mapping bytes to the alphabet): lossy.
        let mut plain = v;
        plain["pre_tokenizer"] = serde_json::Value::Null;
        plain["decoder"] = serde_json::Value::Null;
        let e = Tokenizer::from_json(&plain.to_string()).unwrap_err();
        assert!(
            matches!(&e, TextError::TokenizerJson(m) if m.contains("byte-level")),
            "{e}"
        );
    }

    #[test]
    fn corpus_round_trips_and_has_the_documented_length() {
        let data = TextData::austen();
        let split = Split::austen();
        assert_eq!(data.tokenizer().decode(data.train()), split.train);
        assert_eq!(data.tokenizer().decode(data.validation()), split.validation);
        assert_eq!(
            (data.train_len(), data.validation_len()),
            (1_081_401, 54_709)
        );
        assert!(data
            .train()
            .iter()
            .all(|&id| id != 0 && (id as usize) < AUSTEN_VOCAB));
    }

    #[test]
    fn config_json_names_the_fast_tokenizer() {
        let c: serde_json::Value =
            serde_json::from_str(&tokenizer_config_json(Tokenizer::austen(), 512)).unwrap();
        assert_eq!(c["tokenizer_class"], "PreTrainedTokenizerFast");
        assert_eq!(c["eos_token"], EOS);
        assert!(c["bos_token"].is_null());
        assert_eq!(c["model_max_length"], 512);
        assert_eq!(c["clean_up_tokenization_spaces"], false);
        assert_eq!(c["added_tokens_decoder"]["0"]["content"], EOS);
        assert_eq!(c["added_tokens_decoder"]["0"]["special"], true);
    }

    #[test]
    fn stream_rng_is_the_documented_seeding() {
        let node = [7u8; 32];
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&3u64.to_le_bytes());
        bytes.extend_from_slice(&9u64.to_le_bytes());
        bytes.extend_from_slice(&node);
        bytes.extend_from_slice(&11u64.to_le_bytes());
        let mut want = ChaCha20Rng::from_seed(Sha256::digest(&bytes).into());
        let mut got = stream_rng(3, 9, &node, 11);
        for _ in 0..8 {
            assert_eq!(got.next_u32(), want.next_u32());
        }
        // And batch_windows draws from it with uniform_index.
        let mut rng = stream_rng(3, 9, &node, 11);
        let want: Vec<usize> = (0..5).map(|_| uniform_index(&mut rng, 1000 - 16)).collect();
        assert_eq!(batch_windows(3, 9, &node, 11, 5, 16, 1000).unwrap(), want);
    }

    #[test]
    fn batch_stream_is_deterministic_and_salted() {
        let node = [1u8; 32];
        let n = TextData::austen().train_len();
        let base = batch_windows(5, 2, &node, 100, 64, 256, n).unwrap();
        assert_eq!(base.len(), 64);
        assert_eq!(base, batch_windows(5, 2, &node, 100, 64, 256, n).unwrap());
        assert!(base.iter().all(|&s| s + 257 <= n));
        let mut other = node;
        other[31] ^= 1;
        for variant in [
            batch_windows(6, 2, &node, 100, 64, 256, n),
            batch_windows(5, 3, &node, 100, 64, 256, n),
            batch_windows(5, 2, &other, 100, 64, 256, n),
            batch_windows(5, 2, &node, 101, 64, 256, n),
        ] {
            assert_ne!(variant.unwrap(), base);
        }
        // A longer batch extends the shorter one (draws are in row order).
        assert_eq!(
            batch_windows(5, 2, &node, 100, 80, 256, n).unwrap()[..64],
            base[..]
        );
        // The smallest stream: one valid start.
        assert_eq!(
            batch_windows(0, 0, &node, 0, 3, 4, 5).unwrap(),
            vec![0, 0, 0]
        );
    }

    #[test]
    fn batch_errors() {
        let node = [0u8; 32];
        assert_eq!(
            batch_windows(0, 0, &node, 0, 0, 8, 100),
            Err(TextError::Zero("batch"))
        );
        assert_eq!(
            batch_windows(0, 0, &node, 0, 1, 0, 100),
            Err(TextError::Zero("seq_len"))
        );
        assert_eq!(
            batch_windows(0, 0, &node, 0, 1, 8, 8),
            Err(TextError::WindowTooLong {
                window: 9,
                tokens: 8
            })
        );
        if usize::BITS > 32 {
            let huge = (1usize << 32) + 10;
            assert!(matches!(
                batch_windows(0, 0, &node, 0, 1, 8, huge),
                Err(TextError::StreamTooLong(_))
            ));
        }
        let tokens: Vec<u32> = (0..10).collect();
        assert_eq!(
            batch_tokens(&tokens, &[0], 0),
            Err(TextError::Zero("seq_len"))
        );
        assert_eq!(batch_tokens(&tokens, &[], 3), Err(TextError::Zero("batch")));
        assert_eq!(
            batch_tokens(&tokens, &[6, 7], 3),
            Err(TextError::StartOutOfRange {
                start: 7,
                window: 4,
                tokens: 10
            })
        );
        assert!(matches!(
            batch_tokens(&tokens, &[usize::MAX], 3),
            Err(TextError::StartOutOfRange { .. })
        ));
    }

    #[test]
    fn batch_tokens_gathers_rows() {
        let tokens: Vec<u32> = (100..120).collect();
        assert_eq!(
            batch_tokens(&tokens, &[0, 16, 5], 3).unwrap(),
            vec![100, 101, 102, 103, 116, 117, 118, 119, 105, 106, 107, 108]
        );
        let data = TextData::austen();
        let node = [9u8; 32];
        let starts = batch_windows(1, 1, &node, 0, 4, 32, data.train_len()).unwrap();
        let rows = batch_tokens(data.train(), &starts, 32).unwrap();
        assert_eq!(rows.len(), 4 * 33);
        for (r, &s) in starts.iter().enumerate() {
            assert_eq!(rows[r * 33..(r + 1) * 33], data.train()[s..s + 33]);
        }
    }

    #[test]
    fn validation_shard() {
        assert_eq!(validation_windows(100, 10, 35).unwrap(), vec![0, 10, 20]);
        assert_eq!(validation_scored_tokens(100, 10, 35).unwrap(), 30);
        // Clipped to the stream: 100 tokens hold 9 windows of 11 (the last ends at 91).
        assert_eq!(
            validation_windows(100, 10, 1_000_000).unwrap(),
            (0..9).map(|i| i * 10).collect::<Vec<_>>()
        );
        assert_eq!(validation_windows(101, 10, 1_000_000).unwrap().len(), 10);
        assert_eq!(validation_windows(11, 10, 10).unwrap(), vec![0]);
        assert_eq!(
            validation_windows(10, 10, 10),
            Err(TextError::WindowTooLong {
                window: 11,
                tokens: 10
            })
        );
        assert_eq!(
            validation_windows(100, 10, 9),
            Err(TextError::ShardTooSmall {
                shard_tokens: 9,
                seq_len: 10
            })
        );
        assert_eq!(
            validation_windows(100, 0, 9),
            Err(TextError::Zero("seq_len"))
        );
        assert_eq!(
            validation_windows(100, 10, 0),
            Err(TextError::Zero("shard_tokens"))
        );
        // Every window fits, and the shard covers a prefix of the stream without gaps.
        let v = TextData::austen().validation_len();
        let w = validation_windows(v, 256, 1 << 40).unwrap();
        assert_eq!(w.len(), (v - 1) / 256);
        assert!(w.last().unwrap() + 257 <= v);
        let rows = batch_tokens(TextData::austen().validation(), &w, 256).unwrap();
        assert_eq!(rows.len(), w.len() * 257);
    }

    proptest! {
        #[test]
        fn batch_windows_are_in_bounds(
            seed in any::<u64>(),
            job in any::<u64>(),
            node in any::<[u8; 32]>(),
            step in any::<u64>(),
            batch in 1u32..64,
            seq_len in 1u32..2048,
            extra in 0usize..100_000,
        ) {
            let train_tokens = seq_len as usize + 1 + extra;
            let w = batch_windows(seed, job, &node, step, batch, seq_len, train_tokens).unwrap();
            prop_assert_eq!(w.len(), batch as usize);
            for s in w {
                prop_assert!(s + (seq_len as usize) < train_tokens);
            }
        }
    }

    /// Rewrites `data/austen/tokenizer.json` from the training split:
    /// `cargo test -p hanzod-train --lib text::tests::regenerate_austen_tokenizer -- --ignored`.
    #[test]
    #[ignore = "writes data/austen/tokenizer.json"]
    fn regenerate_austen_tokenizer() {
        let tok = train_tokenizer(&Split::austen().train, AUSTEN_VOCAB).unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/austen/tokenizer.json");
        std::fs::write(path, tok.to_json()).unwrap();
    }

    /// Timings of training and tokenizing (`--nocapture` to see them).
    #[test]
    #[ignore = "timing report"]
    fn timings() {
        let split = Split::austen();
        let t0 = std::time::Instant::now();
        let tok = train_tokenizer(&split.train, AUSTEN_VOCAB).unwrap();
        let train_time = t0.elapsed();
        let t0 = std::time::Instant::now();
        let fresh = Tokenizer::from_json(AUSTEN_TOKENIZER_JSON).unwrap();
        let load_time = t0.elapsed();
        let t0 = std::time::Instant::now();
        let data = TextData::new(fresh, &split);
        let encode_time = t0.elapsed();
        eprintln!(
            "train {train_time:?}, load {load_time:?}, encode {encode_time:?}: {} + {} tokens; \
             {} bytes/token; vocab {}",
            data.train_len(),
            data.validation_len(),
            split.train.len() as f64 / data.train_len() as f64,
            tok.vocab_size()
        );
    }

    /// Writes tokenizer.json, tokenizer_config.json, validation.txt and the Rust ids of
    /// the first 2,000 characters of the validation text (ids.json) into
    /// `$HANZOD_TEXT_CHECK_DIR`, for the `transformers` comparison.
    #[test]
    #[ignore = "writes files for a Python check"]
    fn write_python_check_files() {
        let dir = std::path::PathBuf::from(std::env::var("HANZOD_TEXT_CHECK_DIR").unwrap());
        let tok = Tokenizer::austen();
        let val = Split::austen().validation;
        std::fs::write(dir.join("tokenizer.json"), tok.to_json()).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            tokenizer_config_json(tok, 2048),
        )
        .unwrap();
        std::fs::write(dir.join("validation.txt"), &val).unwrap();
        let ids = tok.encode(&val[..2000]);
        std::fs::write(dir.join("ids.json"), serde_json::to_string(&ids).unwrap()).unwrap();
        let all = serde_json::to_string(&TextData::austen().validation()).unwrap();
        std::fs::write(dir.join("validation_ids.json"), all).unwrap();
    }
}
