//! A quality check users can run: 20 short factual questions, each answered
//! greedily through the model's chat template, counted correct when the
//! answer contains the expected word (case-insensitive). It turns the
//! speed / quality trade-off between the thinker's models into a table.

use crate::model::Llama;
use crate::sampling;
use crate::tokenizer::{ChatMessage, TextTokenizer};
use crate::Result;
use std::time::Instant;

/// The questions and a word every correct answer contains.
pub const QUESTIONS: [(&str, &str); 20] = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("How many days are there in a week?", "seven|7"),
    ("What is 12 + 35?", "47"),
    ("Which planet is known as the Red Planet?", "Mars"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("What is the chemical symbol for gold?", "Au"),
    ("What is the largest ocean on Earth?", "Pacific"),
    (
        "What gas do plants absorb from the air for photosynthesis?",
        "carbon dioxide|CO2",
    ),
    ("How many legs does a spider have?", "eight|8"),
    (
        "What is the boiling point of water at sea level in Celsius?",
        "100",
    ),
    ("Which language is mainly spoken in Brazil?", "Portuguese"),
    ("What is the square root of 81?", "9|nine"),
    ("Who painted the Mona Lisa?", "Leonardo"),
    ("What is the freezing point of water in Fahrenheit?", "32"),
    ("What is the capital of Italy?", "Rome"),
    ("Which animal is known as the king of the jungle?", "lion"),
    ("What is the smallest prime number?", "2|two"),
    ("How many continents are there?", "seven|7"),
    ("In which country are the pyramids of Giza?", "Egypt"),
];

/// One question's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalAnswer {
    /// The question.
    pub question: &'static str,
    /// The expected word(s), `|`-separated alternatives.
    pub expected: &'static str,
    /// The model's answer.
    pub answer: String,
    /// Whether the answer contains one of the expected words.
    pub correct: bool,
}

/// The outcome over [`QUESTIONS`].
#[derive(Debug, Clone, PartialEq)]
pub struct EvalReport {
    /// Per question.
    pub answers: Vec<EvalAnswer>,
    /// Tokens decoded over all questions.
    pub tokens: usize,
    /// Wall time of all questions (prefill and decode), seconds.
    pub seconds: f64,
}

impl EvalReport {
    /// Questions answered correctly.
    pub fn correct(&self) -> usize {
        self.answers.iter().filter(|a| a.correct).count()
    }
}

/// Whether `answer` contains one of `expected`'s `|`-separated words as a
/// whole word (not inside a longer word or number), ignoring case.
pub fn contains_expected(answer: &str, expected: &str) -> bool {
    let a = answer.to_lowercase();
    expected.split('|').any(|w| {
        let w = w.to_lowercase();
        a.match_indices(&w).any(|(i, _)| {
            let before = a[..i].chars().next_back();
            let after = a[i + w.len()..].chars().next();
            !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
        })
    })
}

/// Ask every question of [`QUESTIONS`] (fresh conversation each, greedy,
/// at most `max_tokens` tokens, stopping at end-of-turn tokens).
pub fn evaluate(model: &mut Llama, tok: &TextTokenizer, max_tokens: usize) -> Result<EvalReport> {
    let t = Instant::now();
    let mut answers = Vec::with_capacity(QUESTIONS.len());
    let mut tokens = 0;
    for (question, expected) in QUESTIONS {
        let text = tok.render_chat(&[ChatMessage::new("user", question)], true)?;
        let ids = tok.encode(&text)?;
        model.reset();
        let mut logits = model.forward(&ids)?;
        let mut out = Vec::new();
        for _ in 0..max_tokens {
            let id = sampling::argmax(&logits) as u32;
            if id == tok.eos() || tok.is_control(id) {
                break;
            }
            out.push(id);
            logits = model.forward(&[id])?;
        }
        tokens += out.len();
        let answer = tok.decode(&out);
        answers.push(EvalAnswer {
            question,
            expected,
            correct: contains_expected(&answer, expected),
            answer,
        });
    }
    Ok(EvalReport {
        answers,
        tokens,
        seconds: t.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_words_match_case_insensitively_with_alternatives() {
        assert!(contains_expected("The capital is PARIS.", "Paris"));
        assert!(contains_expected("There are 7 days.", "seven|7"));
        assert!(!contains_expected("Lyon", "Paris"));
        assert!(!contains_expected("because", "Au"));
        assert!(!contains_expected("12", "2|two"));
        assert!(contains_expected("Au.", "Au"));
        assert_eq!(QUESTIONS.len(), 20);
    }
}
