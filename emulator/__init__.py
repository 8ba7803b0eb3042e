"""stockade.emulator"""
