//! English text normalization and sentence / clause splitting, before
//! phonemization.
//!
//! Piper hands raw text to espeak-ng, which reads digits itself but splits a
//! sentence after abbreviations such as "Mr." and reads "$5" as "dollar
//! five". Normalizing first keeps espeak's sentence and clause boundaries
//! where a reader expects them and makes numbers, currency, ordinals, years,
//! times and common abbreviations read as words. Text that needs no
//! normalization reaches espeak-ng unchanged, so its phonemes are exactly
//! Piper's.

/// A clause: text up to and including its punctuation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clause {
    /// The clause text as given to espeak-ng (with its punctuation).
    pub text: String,
    /// The punctuation that ends it (`.`, `?`, `!`, `,`, `:`, `;`), if any.
    pub terminator: Option<char>,
}

/// A sentence: clauses ending with `.`, `?`, `!` or the end of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sentence {
    /// Its clauses, in order.
    pub clauses: Vec<Clause>,
}

impl Sentence {
    /// The sentence text (clauses joined by spaces).
    pub fn text(&self) -> String {
        self.clauses
            .iter()
            .map(|c| c.text.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

const ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
const TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];
const SCALES: [&str; 5] = ["", "thousand", "million", "billion", "trillion"];

fn below_thousand(n: u64, out: &mut Vec<String>) {
    let (h, r) = (n / 100, n % 100);
    if h > 0 {
        out.push(ONES[h as usize].to_string());
        out.push("hundred".to_string());
    }
    if r >= 20 {
        out.push(TENS[(r / 10) as usize].to_string());
        if r % 10 > 0 {
            out.push(ONES[(r % 10) as usize].to_string());
        }
    } else if r > 0 || h == 0 {
        out.push(ONES[r as usize].to_string());
    }
}

/// A whole number in words: `1234` -> "one thousand two hundred thirty four".
/// Numbers of a quadrillion and more are read digit by digit.
pub fn cardinal(n: u64) -> String {
    if n >= 1_000_000_000_000_000 {
        return digits(&n.to_string());
    }
    if n == 0 {
        return "zero".into();
    }
    let mut groups = Vec::new();
    let mut m = n;
    while m > 0 {
        groups.push(m % 1000);
        m /= 1000;
    }
    let mut out = Vec::new();
    for (i, &g) in groups.iter().enumerate().rev() {
        if g == 0 {
            continue;
        }
        below_thousand(g, &mut out);
        if i > 0 {
            out.push(SCALES[i].to_string());
        }
    }
    out.join(" ")
}

/// Digits one by one: "2 0 5" -> "two zero five".
pub fn digits(s: &str) -> String {
    s.chars()
        .filter_map(|c| c.to_digit(10))
        .map(|d| ONES[d as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

/// An ordinal in words: `21` -> "twenty first".
pub fn ordinal(n: u64) -> String {
    let c = cardinal(n);
    let (head, last) = match c.rsplit_once(' ') {
        Some((h, l)) => (format!("{h} "), l.to_string()),
        None => (String::new(), c.clone()),
    };
    let last = match last.as_str() {
        "one" => "first".to_string(),
        "two" => "second".to_string(),
        "three" => "third".to_string(),
        "five" => "fifth".to_string(),
        "eight" => "eighth".to_string(),
        "nine" => "ninth".to_string(),
        "twelve" => "twelfth".to_string(),
        l if l.ends_with('y') => format!("{}ieth", &l[..l.len() - 1]),
        l => format!("{l}th"),
    };
    format!("{head}{last}")
}

/// A year as spoken: 1990 -> "nineteen ninety", 1905 -> "nineteen oh five",
/// 2008 -> "two thousand eight", 2024 -> "twenty twenty four".
pub fn year(n: u64) -> String {
    let (hi, lo) = (n / 100, n % 100);
    if (2000..2010).contains(&n) || !(1000..10000).contains(&n) {
        return cardinal(n);
    }
    let lo_words = match lo {
        0 => "hundred".to_string(),
        1..=9 => format!("oh {}", ONES[lo as usize]),
        _ => cardinal(lo),
    };
    format!("{} {lo_words}", cardinal(hi))
}

fn is_year(n: u64) -> bool {
    (1100..=2099).contains(&n)
}

/// Titles that never end a sentence.
const TITLES: &[(&str, &str)] = &[
    ("Mr.", "Mister"),
    ("Mrs.", "Missus"),
    ("Ms.", "Miz"),
    ("Dr.", "Doctor"),
    ("Prof.", "Professor"),
    ("Gen.", "General"),
    ("Capt.", "Captain"),
    ("Sgt.", "Sergeant"),
    ("Lt.", "Lieutenant"),
    ("Rev.", "Reverend"),
    ("Hon.", "Honorable"),
    ("Mt.", "Mount"),
    ("Ft.", "Fort"),
    ("vs.", "versus"),
    ("e.g.", "for example"),
    ("i.e.", "that is"),
    ("approx.", "approximately"),
    ("Fig.", "Figure"),
    ("Jan.", "January"),
    ("Feb.", "February"),
    ("Mar.", "March"),
    ("Apr.", "April"),
    ("Jun.", "June"),
    ("Jul.", "July"),
    ("Aug.", "August"),
    ("Sep.", "September"),
    ("Sept.", "September"),
    ("Oct.", "October"),
    ("Nov.", "November"),
    ("Dec.", "December"),
];

/// Abbreviations that may also end a sentence (then their period stays).
const ENDINGS: &[(&str, &str)] = &[
    ("etc.", "etcetera"),
    ("Inc.", "Incorporated"),
    ("Ltd.", "Limited"),
    ("Co.", "Company"),
    ("Jr.", "Junior"),
    ("Sr.", "Senior"),
    ("Ave.", "Avenue"),
    ("Dept.", "Department"),
];

/// Split a token into leading punctuation, core, trailing punctuation
/// (only `.` stays with an abbreviation core).
fn split_punct(tok: &str) -> (&str, &str, &str) {
    let is_lead = |c: char| matches!(c, '"' | '\'' | '(' | '[' | '{');
    let start = tok.find(|c: char| !is_lead(c)).unwrap_or(tok.len());
    let body = &tok[start..];
    let is_trail = |c: char| {
        matches!(
            c,
            '"' | '\'' | ')' | ']' | '}' | ',' | ';' | ':' | '?' | '!'
        )
    };
    let end = body
        .char_indices()
        .rev()
        .find(|&(_, c)| !is_trail(c))
        .map(|(i, c)| i + c.len_utf8())
        .unwrap_or(0);
    (&tok[..start], &body[..end], &body[end..])
}

fn starts_upper(s: Option<&&str>) -> bool {
    s.and_then(|w| w.trim_start_matches(['"', '\'', '(']).chars().next())
        .is_some_and(|c| c.is_uppercase())
}

/// Expand an abbreviation core (with its period), given the next token.
fn expand_abbreviation(core: &str, next: Option<&&str>) -> Option<String> {
    if let Some((_, full)) = TITLES.iter().find(|(a, _)| *a == core) {
        return Some((*full).to_string());
    }
    if core == "St." {
        // "St. Louis" is a saint; "Baker St." a street.
        let saint = starts_upper(next)
            && next.is_some_and(|w| !w.starts_with(|c: char| c.is_ascii_digit()));
        return Some(
            match (saint, next.is_none()) {
                (true, _) => "Saint",
                (false, true) => "Street.",
                (false, false) => "Street",
            }
            .to_string(),
        );
    }
    if core == "No." && next.is_some_and(|w| w.starts_with(|c: char| c.is_ascii_digit())) {
        return Some("number".to_string());
    }
    if let Some((_, full)) = ENDINGS.iter().find(|(a, _)| *a == core) {
        let ends = next.is_none() || starts_upper(next);
        return Some(if ends {
            format!("{full}.")
        } else {
            (*full).to_string()
        });
    }
    None
}

/// Read the number that starts at `s` (digits with optional `,` thousands
/// groups and an optional decimal part). Returns (integer digits, decimal
/// digits, grouped with commas, byte length).
fn scan_number(s: &str) -> (String, Option<String>, bool, usize) {
    let b = s.as_bytes();
    let mut i = 0;
    let mut int = String::new();
    let mut grouped = false;
    while i < b.len() && b[i].is_ascii_digit() {
        int.push(b[i] as char);
        i += 1;
    }
    // Thousands groups: ",ddd" repeated, only after 1-3 leading digits.
    if int.len() <= 3 {
        while i + 3 < b.len()
            && b[i] == b','
            && b[i + 1..i + 4].iter().all(u8::is_ascii_digit)
            && !(i + 4 < b.len() && b[i + 4].is_ascii_digit())
        {
            int.push_str(&s[i + 1..i + 4]);
            grouped = true;
            i += 4;
        }
    }
    let mut dec = None;
    if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
        let mut d = String::new();
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            d.push(b[i] as char);
            i += 1;
        }
        dec = Some(d);
    }
    (int, dec, grouped, i)
}

fn number_words(int: &str, dec: Option<&str>) -> String {
    let whole = match int.parse::<u64>() {
        Ok(n) if int.len() == 1 || !int.starts_with('0') => cardinal(n),
        _ => digits(int),
    };
    match dec {
        Some(d) => format!("{whole} point {}", digits(d)),
        None => whole,
    }
}

fn currency_name(sym: char, one: bool) -> (&'static str, &'static str) {
    match (sym, one) {
        ('$', true) => ("dollar", "cent"),
        ('$', false) => ("dollars", "cents"),
        ('£', true) => ("pound", "penny"),
        ('£', false) => ("pounds", "pence"),
        ('€', true) => ("euro", "cent"),
        (_, _) => ("euros", "cents"),
    }
}

/// Replace the numbers in one token (no spaces) by words.
fn expand_numbers(tok: &str) -> String {
    let mut out = String::new();
    let mut rest = tok;
    let mut currency: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        if matches!(c, '$' | '£' | '€')
            && rest[c.len_utf8()..].starts_with(|d: char| d.is_ascii_digit())
        {
            currency = Some(c);
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '-' && out.is_empty() && rest[1..].starts_with(|d: char| d.is_ascii_digit()) {
            out.push_str("minus ");
            rest = &rest[1..];
            continue;
        }
        if !c.is_ascii_digit() {
            out.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let (int, dec, grouped, len) = scan_number(rest);
        let after = &rest[len..];
        // Times: 3:30, 12:05, 7:00.
        if dec.is_none() && !grouped && int.len() <= 2 && after.len() >= 3 && after.starts_with(':')
        {
            let mm = &after[1..3];
            let tail_digit = after[3..].starts_with(|d: char| d.is_ascii_digit());
            if mm.bytes().all(|b| b.is_ascii_digit()) && !tail_digit {
                let h: u64 = int.parse().unwrap_or(0);
                let m: u64 = mm.parse().unwrap_or(0);
                let spoken = match m {
                    0 => format!("{} o'clock", cardinal(h)),
                    1..=9 => format!("{} oh {}", cardinal(h), cardinal(m)),
                    _ => format!("{} {}", cardinal(h), cardinal(m)),
                };
                out.push_str(&spoken);
                rest = &after[3..];
                continue;
            }
        }
        let lower = after.to_ascii_lowercase();
        let ord = ["st", "nd", "rd", "th"].iter().find(|s| {
            lower.starts_with(*s) && !lower[2..].starts_with(|c: char| c.is_alphabetic())
        });
        if let (Some(_), None, Ok(n)) = (ord, &dec, int.parse::<u64>()) {
            out.push_str(&ordinal(n));
            rest = &after[2..];
            continue;
        }
        if let Some(sym) = currency.take() {
            let n: u64 = int.parse().unwrap_or(0);
            let (unit, sub) = currency_name(sym, n == 1);
            out.push_str(&format!("{} {unit}", number_words(&int, None)));
            if let Some(d) = dec.as_deref() {
                let cents: u64 = format!("{d:0<2}")[..2].parse().unwrap_or(0);
                if cents > 0 {
                    let (_, sub) = currency_name(sym, cents == 1);
                    out.push_str(&format!(" and {} {sub}", cardinal(cents)));
                }
            }
            let _ = sub;
            rest = after;
            continue;
        }
        let n = int.parse::<u64>().ok();
        let words = match n {
            Some(n)
                if dec.is_none()
                    && !grouped
                    && int.len() == 4
                    && is_year(n)
                    && !after.starts_with('%') =>
            {
                year(n)
            }
            _ => number_words(&int, dec.as_deref()),
        };
        out.push_str(&words);
        if let Some(stripped) = after.strip_prefix('%') {
            out.push_str(" percent");
            rest = stripped;
        } else {
            rest = after;
        }
        // Letters glued to digits ("3D", "10km") read as separate words.
        if rest.starts_with(|c: char| c.is_alphabetic()) {
            out.push(' ');
        }
    }
    out
}

/// Normalize English text for phonemization: unify quotes, dashes and
/// whitespace, expand abbreviations, numbers, currency, percentages,
/// ordinals, years and times, and symbols (`&`, `+`, `=`, `@`).
pub fn normalize(text: &str) -> String {
    // Paragraph breaks end sentences; other whitespace is a space.
    let mut paragraphs = Vec::new();
    for para in text.split("\n\n").flat_map(|p| p.split("\r\n\r\n")) {
        let p = para.split_whitespace().collect::<Vec<_>>().join(" ");
        if p.is_empty() {
            continue;
        }
        let ends = p.ends_with(['.', '?', '!']);
        paragraphs.push(if ends { p } else { format!("{p}.") });
    }
    // A single paragraph keeps its (absent) final punctuation, as Piper does.
    if paragraphs.len() == 1 && !text.trim_end().ends_with(['.', '?', '!']) {
        if let Some(p) = paragraphs.first_mut() {
            p.pop();
        }
    }
    let joined = paragraphs.join(" ");
    let mut s = String::with_capacity(joined.len());
    for c in joined.chars() {
        match c {
            '\u{2018}' | '\u{2019}' | '\u{02BC}' => s.push('\''),
            '\u{201C}' | '\u{201D}' | '\u{00AB}' | '\u{00BB}' => s.push('"'),
            '\u{2013}' | '\u{2014}' => s.push_str(" - "),
            '\u{2026}' => s.push_str("..."),
            '\u{00A0}' => s.push(' '),
            c => s.push(c),
        }
    }
    // Ellipses are a pause inside a sentence (espeak would glue the clauses).
    while let Some(i) = s.find("..") {
        let end = i + s[i..].find(|c: char| c != '.').unwrap_or(s.len() - i);
        let at_end = s[end..].trim().is_empty();
        s.replace_range(i..end, if at_end { "." } else { "," });
    }
    let tokens: Vec<&str> = s.split_whitespace().collect();
    let mut out: Vec<String> = Vec::with_capacity(tokens.len());
    for (i, tok) in tokens.iter().enumerate() {
        let next = tokens.get(i + 1);
        // A spaced dash is a pause.
        if *tok == "-" || *tok == "--" {
            if let Some(last) = out.last_mut() {
                if !last.ends_with([',', '.', '?', '!', ';', ':']) {
                    last.push(',');
                }
            }
            continue;
        }
        match *tok {
            "&" => {
                out.push("and".into());
                continue;
            }
            "+" => {
                out.push("plus".into());
                continue;
            }
            "=" => {
                out.push("equals".into());
                continue;
            }
            "@" => {
                out.push("at".into());
                continue;
            }
            _ => {}
        }
        let (lead, core, trail) = split_punct(tok);
        let core_expanded = if let Some(full) = expand_abbreviation(core, next) {
            full
        } else if core.contains(|c: char| c.is_ascii_digit()) {
            let (body, dot) = match core.strip_suffix('.') {
                Some(b) => (b, "."),
                None => (core, ""),
            };
            format!("{}{dot}", expand_numbers(body))
        } else {
            core.replace('&', " and ")
        };
        out.push(format!("{lead}{core_expanded}{trail}"));
    }
    out.join(" ")
}

fn is_closer(c: char) -> bool {
    matches!(c, '"' | '\'' | ')' | ']' | '}')
}

/// Split normalized text into sentences (at `.`, `?`, `!` followed by a
/// space or the end) and clauses (at `,`, `:`, `;` followed by a space).
pub fn split(normalized: &str) -> Vec<Sentence> {
    let chars: Vec<(usize, char)> = normalized.char_indices().collect();
    let mut sentences = Vec::new();
    let mut clauses = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        let (_, c) = chars[i];
        let is_end = matches!(c, '.' | '?' | '!');
        let is_clause = matches!(c, ',' | ':' | ';');
        if is_end || is_clause {
            // Absorb repeated terminators ("?!") and closing quotes/brackets.
            let mut j = i + 1;
            while j < chars.len()
                && (matches!(chars[j].1, '.' | '?' | '!') || is_closer(chars[j].1))
            {
                j += 1;
            }
            let boundary = j >= chars.len() || chars[j].1.is_whitespace();
            if boundary {
                let end = chars.get(j).map(|&(b, _)| b).unwrap_or(normalized.len());
                let text = normalized[start..end].trim().to_string();
                if !text.is_empty() {
                    clauses.push(Clause {
                        text,
                        terminator: Some(c),
                    });
                }
                if is_end && !clauses.is_empty() {
                    sentences.push(Sentence {
                        clauses: std::mem::take(&mut clauses),
                    });
                }
                start = end;
                i = j;
                continue;
            }
        }
        i += 1;
    }
    let tail = normalized[start..].trim();
    if !tail.is_empty() {
        clauses.push(Clause {
            text: tail.to_string(),
            terminator: None,
        });
    }
    if !clauses.is_empty() {
        sentences.push(Sentence { clauses });
    }
    sentences.into_iter().flat_map(bound_sentence).collect()
}

/// Longest clause (characters) given to the model in one piece; longer runs
/// without punctuation are cut at a space, with a comma's pause.
pub const MAX_CLAUSE_CHARS: usize = 300;
/// Longest sentence (characters) synthesized in one piece; longer ones are
/// cut at a clause boundary. Attention cost grows with the square of a
/// sentence's length, so this bounds memory and time per sentence.
pub const MAX_SENTENCE_CHARS: usize = 500;

fn cut_clause(c: Clause) -> Vec<Clause> {
    if c.text.chars().count() <= MAX_CLAUSE_CHARS {
        return vec![c];
    }
    let mut out = Vec::new();
    let mut piece = String::new();
    for word in c.text.split_whitespace() {
        if !piece.is_empty() && piece.chars().count() + 1 + word.chars().count() > MAX_CLAUSE_CHARS
        {
            out.push(Clause {
                text: format!("{piece},"),
                terminator: Some(','),
            });
            piece.clear();
        }
        if !piece.is_empty() {
            piece.push(' ');
        }
        piece.push_str(word);
    }
    if !piece.is_empty() {
        out.push(Clause {
            text: piece,
            terminator: c.terminator,
        });
    }
    out
}

fn bound_sentence(s: Sentence) -> Vec<Sentence> {
    let mut out = Vec::new();
    let mut cur: Vec<Clause> = Vec::new();
    let mut chars = 0;
    for c in s.clauses.into_iter().flat_map(cut_clause) {
        let n = c.text.chars().count();
        if !cur.is_empty() && chars + n > MAX_SENTENCE_CHARS {
            out.push(Sentence {
                clauses: std::mem::take(&mut cur),
            });
            chars = 0;
        }
        chars += n + 1;
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(Sentence { clauses: cur });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_words() {
        assert_eq!(cardinal(0), "zero");
        assert_eq!(cardinal(15), "fifteen");
        assert_eq!(cardinal(101), "one hundred one");
        assert_eq!(
            cardinal(1_234_567),
            "one million two hundred thirty four thousand five hundred sixty seven"
        );
        assert_eq!(ordinal(1), "first");
        assert_eq!(ordinal(22), "twenty second");
        assert_eq!(ordinal(40), "fortieth");
        assert_eq!(ordinal(112), "one hundred twelfth");
        assert_eq!(year(1990), "nineteen ninety");
        assert_eq!(year(1905), "nineteen oh five");
        assert_eq!(year(1900), "nineteen hundred");
        assert_eq!(year(2008), "two thousand eight");
        assert_eq!(year(2024), "twenty twenty four");
    }

    #[test]
    fn normalizes_common_patterns() {
        let cases = [
            (
                "Dr. Smith paid $12.50 for 3 apples.",
                "Doctor Smith paid twelve dollars and fifty cents for three apples.",
            ),
            (
                "It rose 50% in 1990!",
                "It rose fifty percent in nineteen ninety!",
            ),
            ("We have 1,000,000 users", "We have one million users"),
            (
                "Pi is 3.14, roughly.",
                "Pi is three point one four, roughly.",
            ),
            (
                "Meet me at 3:30 on the 21st.",
                "Meet me at three thirty on the twenty first.",
            ),
            ("It is 7:00 now", "It is seven o'clock now"),
            (
                "Apples, pears, etc. are fruit.",
                "Apples, pears, etcetera are fruit.",
            ),
            (
                "I work at Acme Inc. It is fine.",
                "I work at Acme Incorporated. It is fine.",
            ),
            ("Wait... what?", "Wait, what?"),
            ("Salt & pepper - please", "Salt and pepper, please"),
            (
                "It was \u{201C}fine\u{201D} \u{2014} really",
                "It was \"fine\", really",
            ),
            ("It is -5 degrees", "It is minus five degrees"),
            (
                "He lives on St. Louis Ave. near Baker St.",
                "He lives on Saint Louis Avenue near Baker Street.",
            ),
            ("Hello world", "Hello world"),
            ("Room No. 5", "Room number five"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input), want, "input: {input}");
        }
    }

    #[test]
    fn text_without_digits_or_abbreviations_is_unchanged() {
        for t in [
            "The quick brown fox jumps over the lazy dog.",
            "Is it raining? No, it's sunny!",
            "Edge devices can speak, listen, and think: all at once.",
        ] {
            assert_eq!(normalize(t), t);
        }
    }

    #[test]
    fn splits_sentences_and_clauses() {
        let s = split("Is it raining? No, it's sunny! Edge devices: all at once");
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[0].clauses,
            vec![Clause {
                text: "Is it raining?".into(),
                terminator: Some('?')
            }]
        );
        assert_eq!(s[1].clauses.len(), 2);
        assert_eq!(s[1].clauses[0].terminator, Some(','));
        assert_eq!(s[1].clauses[1].text, "it's sunny!");
        assert_eq!(s[2].clauses[1].terminator, None);
        assert_eq!(s[2].text(), "Edge devices: all at once");
        assert!(split("   ").is_empty());
        assert_eq!(split("He said \"stop.\" Then left.").len(), 2);
        assert_eq!(split("Version 3.14 is out.").len(), 1);
    }

    #[test]
    fn long_runs_are_bounded() {
        let text = "word ".repeat(2000);
        let s = split(text.trim());
        assert!(s.len() >= 2000 * 5 / MAX_SENTENCE_CHARS);
        for sentence in &s {
            assert!(sentence.text().chars().count() <= MAX_SENTENCE_CHARS + 2);
            for c in &sentence.clauses {
                assert!(c.text.chars().count() <= MAX_CLAUSE_CHARS + 1);
            }
        }
        let words: usize = s.iter().map(|x| x.text().split_whitespace().count()).sum();
        assert_eq!(words, 2000);
    }

    #[test]
    fn paragraphs_end_sentences() {
        let n = normalize("First line\n\nSecond line");
        assert_eq!(n, "First line. Second line.");
        assert_eq!(split(&n).len(), 2);
    }
}
