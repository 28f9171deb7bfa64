//! Text front end parity with Piper (piper-tts 1.8.0): identical phonemes and
//! phoneme ids for every fixture sentence (scripts/piper_reference.py).

mod common;

use edgeflow_piper::piper::{FrontEnd, VoiceConfig};

#[test]
fn phoneme_ids_match_piper() {
    let Some(voice) = common::voice() else { return };
    let config = VoiceConfig::read(&voice.config).expect("voice config");
    let fe = FrontEnd::new(config, true);
    for case in common::reference() {
        let got = fe.sentences(&case.text).expect("front end");
        assert_eq!(
            got.len(),
            case.sentences.len(),
            "sentence count for {:?}",
            case.text
        );
        for (g, w) in got.iter().zip(&case.sentences) {
            assert_eq!(g.phonemes, w.phonemes, "phonemes of {:?}", case.text);
            assert_eq!(g.ids, w.ids, "ids of {:?}", case.text);
        }
    }
}

#[test]
fn empty_text_gives_no_sentences() {
    let Some(voice) = common::voice() else { return };
    let config = VoiceConfig::read(&voice.config).expect("voice config");
    let fe = FrontEnd::new(config, true);
    assert!(fe.sentences("").expect("empty").is_empty());
    assert!(fe.sentences("   \n ").expect("blank").is_empty());
    let huge = "a ".repeat(60_000);
    let err = fe.sentences(&huge).expect_err("too long");
    assert!(err.to_string().contains("longer than"), "{err}");
}

#[test]
fn normalized_text_reads_numbers_and_abbreviations() {
    let Some(voice) = common::voice() else { return };
    let config = VoiceConfig::read(&voice.config).expect("voice config");
    let fe = FrontEnd::new(config, true);
    // Without normalization espeak-ng would end a sentence after "Mr.".
    let s = fe.sentences("Mr. Smith paid $5.").expect("front end");
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].text, "Mister Smith paid five dollars.");
}
